#!/usr/bin/env python3
"""Make PyPI's CUDA build of torch importable on a CPU-only machine without the
~3.2 GiB of nvidia-* wheels it depends on.

PyPI only serves CUDA builds of torch for linux/x86_64; its libraries link against
libcudart, libcublas, libcudnn, libnccl, ... (DT_NEEDED), so `import torch` fails
when torch is installed with --no-deps. This script reads the dynamic symbol tables
of the installed torch libraries and builds, with the system C compiler, one small
stub shared object per missing CUDA library (right SONAME, right symbol versions,
every referenced symbol defined). The stubs go to
`<site-packages>/nvidia/cu13/lib/`, which is already on torch's RPATH, so no
LD_LIBRARY_PATH is needed.

Effect: `import torch` works, `torch.cuda.is_available()` is False (the stub
cudaGetDeviceCount reports no device), every CPU op works. Any real CUDA call
returns an error code. This is for parsing and pure-Python logic only (contract
tests of sglang's argument parser, KV layout selection, plugin specs).

libcuda.so.1 (the driver) is deliberately NOT stubbed, so triton and other code
that probes for a driver still sees none.

Usage:  python -m sglang_pd_operator.oracle.cuda_stubs [SITE_PACKAGES]   (`sglang-pd-operator sglang install` runs it)
        (defaults to the running interpreter's purelib; idempotent)
Needs:  readelf (binutils) and cc (gcc).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

SYSTEM_VERSIONS = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC_|OMP|GOMP)")
SYSTEM_LIBS = re.compile(
    r"^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libgomp|ld-linux.*)\.so"
)
# Never stub the driver: other packages dlopen it to decide whether a GPU exists.
NEVER_STUB = {"libcuda.so.1"}
# Loaded lazily by torch, and only useful with a driver.
SKIP_ELFS = {"libcaffe2_nvrtc.so"}
# Unversioned symbols: which stub defines them does not matter for the dynamic
# linker (global scope), but keep them in their natural library.
UNVERSIONED_HOME = (
    ("nccl", "libnccl.so.2"),
    ("cusparseLt", "libcusparseLt.so.0"),
    ("cuFile", "libcufile.so.0"),
    ("curand", "libcurand.so.10"),
    ("nvshmem", "libnvshmem_host.so.3"),
)
STUB_MARKER = "cuda-stub-for-cpu-contract-tests"

# Functions whose result callers use (pointers, out-params read on "success").
SPECIAL = {
    "cudaGetDeviceCount": "int cudaGetDeviceCount(int *n){ if(n) *n = 0; return 100; }",
    "cudaRuntimeGetVersion": "int cudaRuntimeGetVersion(int *v){ if(v) *v = 13000; return 0; }",
    "cudaDriverGetVersion": "int cudaDriverGetVersion(int *v){ if(v) *v = 0; return 35; }",
    "ncclGetVersion": "int ncclGetVersion(int *v){ if(v) *v = 0; return 1; }",
    "cudnnGetVersion": "unsigned long cudnnGetVersion(void){ return 0; }",
    "cudaGetLastError": "int cudaGetLastError(void){ return 0; }",
    "cudaPeekAtLastError": "int cudaPeekAtLastError(void){ return 0; }",
}
STRING_RETURNING = re.compile(
    r"(GetErrorString|GetErrorName|GetStatusString|GetStatusName|GetLastError|GetResultString)$"
)


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _needed(elf: str) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _run("readelf", "-d", elf))


def _verneed(elf: str) -> dict[str, str]:
    """version name -> file that must define it."""
    out, current, result = _run("readelf", "-V", "-W", elf), None, {}
    in_r = False
    for line in out.splitlines():
        if ".gnu.version_r" in line:
            in_r = True
            continue
        if in_r and "section" in line and ".gnu.version_r" not in line:
            in_r = False
        if not in_r:
            continue
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and current:
            result[m.group(1)] = current
    return result


def _dynsyms(elf: str):
    for line in _run("readelf", "-W", "--dyn-syms", elf).splitlines():
        p = line.split()
        if len(p) < 8 or not p[0].endswith(":"):
            continue
        typ, bind, ndx, name = p[3], p[4], p[6], p[7]
        base, _, ver = name.partition("@")
        yield typ, bind, ndx, base, ver.lstrip("@")


def plan(site_packages: str) -> dict[str, dict[str, set[str]]]:
    """soname -> {version name or '' -> symbols} for every CUDA library torch needs."""
    torch_lib = os.path.join(site_packages, "torch", "lib")
    if not os.path.isdir(torch_lib):
        raise SystemExit(f"no torch/lib under {site_packages}")
    elfs = [
        e
        for e in sorted(glob.glob(os.path.join(torch_lib, "*.so*")))
        + glob.glob(os.path.join(site_packages, "torch", "_C*.so"))
        if os.path.basename(e) not in SKIP_ELFS
    ]
    own = {os.path.basename(e) for e in elfs}
    defined: set[str] = set()
    wanted: dict[str, dict[str, set[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(set)
    )
    unversioned: set[str] = set()
    for elf in elfs:
        for name in _needed(elf):
            if name not in own and not SYSTEM_LIBS.match(name) and name not in NEVER_STUB:
                wanted[name]  # noqa: B018 - make sure every needed soname gets a stub
        vermap = _verneed(elf)
        for typ, bind, ndx, base, ver in _dynsyms(elf):
            if ndx != "UND":
                defined.add(base)
                continue
            if not base or bind == "WEAK" or base.startswith(("Py", "_Py")):
                continue
            ver = ver.split(" ")[0]
            if ver:
                if SYSTEM_VERSIONS.match(ver):
                    continue
                soname = vermap.get(ver, ver)
                if soname in NEVER_STUB:
                    continue
                wanted[soname][ver].add(base)
            else:
                unversioned.add(base)
    # Unversioned leftovers that neither torch nor the C/C++ runtime defines.
    system_defined: set[str] = set()
    for lib in ("libstdc++.so.6", "libc.so.6", "libm.so.6", "libgcc_s.so.1"):
        path = _find_system_lib(lib)
        if path:
            system_defined |= {b for _, _, ndx, b, _ in _dynsyms(path) if ndx != "UND"}
    for sym in sorted(unversioned - defined - system_defined):
        if sym.startswith("cu") and not sym.startswith(("cublas", "cusparse", "cufft", "cudnn", "cuda", "curand", "cuFile")):
            continue  # driver API (libcuda), left unresolved on purpose
        home = next((s for p, s in UNVERSIONED_HOME if sym.startswith(p)), "libcudart.so.13")
        wanted[home][""].add(sym)
    for soname in list(wanted):
        for ver in list(wanted[soname]):
            wanted[soname][ver] -= defined if ver == "" else set()
    return wanted


def _find_system_lib(name: str) -> str | None:
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return None


def build(site_packages: str) -> list[str]:
    out_dir = os.path.join(site_packages, "nvidia", "cu13", "lib")
    os.makedirs(out_dir, exist_ok=True)
    built = []
    for soname, versions in sorted(plan(site_packages).items()):
        target = os.path.join(out_dir, soname)
        if os.path.exists(target) and STUB_MARKER.encode() not in open(target, "rb").read():
            continue  # a real library is installed: leave it alone
        body = [f'const char cuda_stub_marker[] = "{STUB_MARKER}";']
        body.append('static const char stub_msg[] = "CUDA stub library (no GPU on this machine)";')
        all_syms = sorted({s for syms in versions.values() for s in syms})
        for sym in all_syms:
            if sym in SPECIAL:
                body.append(SPECIAL[sym])
            elif STRING_RETURNING.search(sym):
                body.append(f"const char *{sym}(void){{ return stub_msg; }}")
            else:
                body.append(f"long {sym}(void){{ return 100; }}")
        script = []
        named = [v for v in versions if v]
        for ver in named:
            syms = "".join(f"    {s};\n" for s in sorted(versions[ver]))
            script.append(f"{ver} {{\n  global:\n{syms}}};\n")
        local = sorted(versions.get("", set()))
        if local or not named:
            syms = "".join(f"    {s};\n" for s in local)
            syms += "    cuda_stub_marker;\n"
            script.append(f"{{\n  global:\n{syms}  local: *;\n}};\n")
        else:
            script[-1] = script[-1].replace("};\n", "    cuda_stub_marker;\n  local: *;\n};\n")
        with tempfile.TemporaryDirectory() as tmp:
            c_file = os.path.join(tmp, "stub.c")
            map_file = os.path.join(tmp, "stub.map")
            with open(c_file, "w") as f:
                f.write("\n".join(body) + "\n")
            with open(map_file, "w") as f:
                f.write("".join(script))
            subprocess.run(
                [
                    os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O0", "-w",
                    "-fno-builtin", f"-Wl,-soname,{soname}",
                    f"-Wl,--version-script,{map_file}", "-o", target, c_file,
                ],
                check=True,
            )
        built.append(target)
    with open(os.path.join(out_dir, "README-STUBS.txt"), "w") as f:
        f.write(
            "Stub CUDA libraries made by sglang_pd_operator/oracle/cuda_stubs.py so that torch imports\n"
            "on a CPU-only machine. They are not CUDA. Remove this folder and install\n"
            "torch with its dependencies to get the real libraries.\n"
        )
    return built


def main() -> None:
    sp = sys.argv[1] if len(sys.argv) > 1 else sysconfig.get_paths()["purelib"]
    for path in build(sp):
        print("stub:", path)


if __name__ == "__main__":
    main()
