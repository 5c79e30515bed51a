"""Build, start and push the operator and oracle images without a Docker engine (``hack/images.sh``).

The Dockerfiles (images/operator/Dockerfile) stay the build for machines with Docker; this
module is the build for machines with Debian's packages, PyPI and the Go module proxy:

* ``lock-base``: resolve the Debian base (mmdebstrap's ``essential`` set of a minimal
  bookworm plus ``python3``) and write every package's exact version to
  images/base/debian.yaml, and the same pins into the Dockerfile's ``apt-get install`` line.
* ``build operator|oracle``: mmdebstrap installs exactly those pinned packages into a
  directory (Debian's own tool, ``--variant=custom``); the project's wheel and its locked
  dependencies (requirements/lock.txt) are built on the host with pip and installed inside
  the root with pip run from its wheel (pip itself is not left in the image); umoci makes the
  OCI image from the directory (user, entrypoint, command and environment read from the
  Dockerfile). Every time stamp is SOURCE_DATE_EPOCH (debian.yaml ``epoch``), so the same
  inputs give the same digest. The result: ``.run/images/<name>.oci/`` (an OCI layout) and
  ``.run/images/<name>.oci.tar`` (the same as one archive), both renamed into place only
  when complete; the digest and sizes are printed and written to ``<name>.json``.
* ``verify-reproducible operator|oracle``: two builds from nothing (no cached Debian base,
  no pip cache) into .run/images/reproducible/; their full digests must be equal.
* ``smoke operator|oracle``: runc starts the image's root filesystem read-only as user
  65532 (the operator image: ``run`` against the dev cluster with the chart's
  ServiceAccount token until an example is Ready; the oracle image: SGLang's verdict).
* ``registry`` / ``push``: the Docker Distribution registry built from its Go module
  (hack/images/registry/go.mod, via hack/gotool.py) on loopback; skopeo pushes the archive.
* ``chart-check``: the chart rendered with image.repository/image.digest names a
  manifest the registry serves (its HTTP API).

Needs root (mmdebstrap's root mode, chroot, runc). Missing Debian tools (mmdebstrap,
umoci, runc, skopeo) are installed with apt-get.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE_FILE = ROOT / "images" / "base" / "debian.yaml"
OPERATOR_DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
ORACLE_DOCKERFILE = ROOT / "images" / "oracle" / "Dockerfile"
OUT = ROOT / ".run" / "images"
LOCK = ROOT / "requirements" / "lock.txt"
ORACLE_REQUIREMENTS = ROOT / "operator" / "oracle" / "requirements"
# What the build copies into the wheel's source tree: the Dockerfile's build stage copies
# the same paths (tests/unit/test_image_builds.py holds the two together).
SOURCE_PATHS = ("pyproject.toml", "README.md", "requirements/lock.txt", "operator", "kernels")
# Debian tools each command needs (package: binary).
TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci", "runc": "runc", "skopeo": "skopeo"}
# Files no image needs: documentation, manuals and translations (dpkg never unpacks them).
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/lintian/*", "/usr/share/linda/*")
DPKG_KEEP = ("/usr/share/doc/*/copyright",)  # licences stay
#: What an image is built from: the wheel's sources, the Dockerfiles and the Debian base
#: (images/), and this build. Every record names their hash and the commit; smoke and push
#: refuse a record built from other inputs (a stale image) or one whose files are incomplete.
BUILD_INPUTS = (*SOURCE_PATHS, "images", "hack/images/images.py")
#: Files of those inputs that do not go into an image (copy_sources leaves them out).
IGNORED_INPUTS = ("__pycache__", "*.pyc", "*.egg-info")
PIN_BEGIN = "# BEGIN pins: written by `hack/images.sh lock-base` from images/base/debian.yaml"
PIN_END = "# END pins"


class ImageError(RuntimeError):
    """A build, smoke run or push failed; the message says which step and why."""


@dataclass(frozen=True)
class Base:
    """images/base/debian.yaml: the Debian suite, mirrors, the packages asked for (``roots``),
    every installed package pinned (``packages``: name -> version), the pip that installs the
    wheels (``pip``, not left in the image) and the time stamp of every file (``epoch``, s)."""

    suite: str
    mirrors: tuple[str, ...]
    roots: tuple[str, ...]
    packages: dict[str, str]
    pip: str
    epoch: int

    @classmethod
    def load(cls, path: Path = BASE_FILE) -> "Base":
        data = yaml.safe_load(path.read_text())
        return cls(suite=data["suite"], mirrors=tuple(data["mirrors"]), roots=tuple(data["roots"]),
                   packages=dict(data["packages"]), pip=str(data["pip"]), epoch=int(data["epoch"]))

    def pins(self) -> list[str]:
        """``name=version`` for every package, sorted by name (apt's and mmdebstrap's syntax)."""
        return [f"{name}={version}" for name, version in sorted(self.packages.items())]


@dataclass(frozen=True)
class ImageConfig:
    """What the Dockerfile's final stage declares: USER, ENTRYPOINT, CMD, ENV (in order)."""

    user: str
    entrypoint: list[str]
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)


DOCKERFILES = {"operator": OPERATOR_DOCKERFILE, "oracle": ORACLE_DOCKERFILE}


def dockerfile_instructions(path: Path = OPERATOR_DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.strip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            op, _, rest = line.partition(" ")
            out.append((op.upper(), " ".join(rest.split())))
    return out


def final_stage(path: Path = OPERATOR_DOCKERFILE) -> list[tuple[str, str]]:
    """The instructions from the Dockerfile's last FROM on."""
    ins = dockerfile_instructions(path)
    last = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last:]


def dockerfile_config(path: Path = OPERATOR_DOCKERFILE) -> ImageConfig:
    """USER, ENTRYPOINT, CMD (exec form) and ENV (``K=V`` pairs) of the final stage."""
    stage = final_stage(path)
    env: dict[str, str] = {}
    user, entrypoint, cmd = "", [], []
    for op, arg in stage:
        if op == "ENV":
            for pair in arg.split():
                key, _, value = pair.partition("=")
                env[key] = value
        elif op == "USER":
            user = arg
        elif op == "ENTRYPOINT":
            entrypoint = json.loads(arg)
        elif op == "CMD":
            cmd = json.loads(arg)
    return ImageConfig(user=user, entrypoint=entrypoint, cmd=cmd, env=env)


def dockerfile_apt_pins(path: Path = OPERATOR_DOCKERFILE) -> dict[str, str]:
    """name -> version of every ``name=version`` in the final stage's ``apt-get install``."""
    pins: dict[str, str] = {}
    for op, arg in final_stage(path):
        if op == "RUN" and "apt-get install" in arg:
            for word in arg.split():
                if "=" in word and not word.startswith("-"):
                    name, _, version = word.partition("=")
                    pins[name] = version
    return pins


def render_pin_block(base: Base) -> str:
    """The Dockerfile's generated ``apt-get install`` of every pinned package (final stage)."""
    lines = [PIN_BEGIN, "RUN apt-get update \\",
             "    && apt-get install -y --no-install-recommends --allow-downgrades \\"]
    lines += [f"       {pin} \\" for pin in base.pins()]
    lines += ["    && rm -rf /var/lib/apt/lists/*", PIN_END]
    return "\n".join(lines)


def dockerfile_with_pins(text: str, base: Base) -> str:
    """``text`` (a Dockerfile) with its pin block replaced by :func:`render_pin_block`."""
    pattern = re.compile(re.escape(PIN_BEGIN) + r".*?" + re.escape(PIN_END), re.S)
    if not pattern.search(text):
        raise ImageError(f"the Dockerfile has no '{PIN_BEGIN}' ... '{PIN_END}' block")
    return pattern.sub(lambda _: render_pin_block(base), text)


def wheel_commands(python: str, image: str, wheels: Path, src: Path) -> list[list[str]]:
    """The ``pip wheel`` commands whose wheels go into ``image`` (operator: the package and
    its locked dependencies; oracle: also SGLang's CPU set and the no-deps set, as
    ``sglang-pd-operator sglang install`` installs them)."""
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "wheel"]
    commands = [[*pip, "-c", str(src / "requirements" / "lock.txt"), "--wheel-dir", str(wheels / "main"), str(src)]]
    if image == "oracle":
        requirements = src / ORACLE_REQUIREMENTS.relative_to(ROOT)
        commands.append([*pip, "-c", str(src / "requirements" / "lock.txt"), "--wheel-dir", str(wheels / "main"),
                         "-r", str(requirements / "sglang-cpu.txt")])
        commands.append([*pip, "--no-deps", "--wheel-dir", str(wheels / "nodeps"),
                         "-r", str(requirements / "sglang-nodeps.txt")])
    return commands


# ---------------------------------------------------------------------------------------
# running things


def log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def run(command: list[str], *, what: str, **kwargs) -> subprocess.CompletedProcess:
    """Run ``command``; on failure raise ImageError naming ``what`` with the output's tail."""
    proc = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise ImageError(f"{what} failed (exit {proc.returncode}): {' '.join(command[:6])} ...\n{tail}")
    return proc


def ensure_tools(*names: str) -> None:
    """Install the Debian packages of the tools ``names`` (keys of TOOLS) when missing."""
    missing = [name for name in names if not shutil.which(TOOLS[name])]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ImageError(f"missing {', '.join(missing)}: install Debian's package(s) (apt-get install {' '.join(missing)})")
    log(f"installing Debian's {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(["apt-get", "install", "-y", "-q", *missing], capture_output=True, env=env).returncode != 0:
        run(["apt-get", "update", "-q"], what="apt-get update")
        run(["apt-get", "install", "-y", "-q", *missing], what=f"apt-get install {' '.join(missing)}", env=env)


def require_root() -> None:
    if os.geteuid() != 0:
        raise ImageError("building and starting images needs root (mmdebstrap's root mode, chroot, runc)")


def mmdebstrap(base: Base, *, target: Path, variant: str, include: list[str]) -> None:
    """mmdebstrap ``include`` into the directory ``target`` (merged /usr, no docs)."""
    hooks = Path("/usr/share/mmdebstrap/hooks/merged-usr")
    command = ["mmdebstrap", f"--variant={variant}", "--mode=root", "--format=directory",
               f"--hook-dir={hooks}", "--aptopt=Acquire::Retries=3",
               *[f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES],
               *[f"--dpkgopt=path-include={p}" for p in DPKG_KEEP]]
    if include:
        command.append("--include=" + ",".join(include))
    command += [base.suite, str(target), *base.mirrors]
    run(command, what="mmdebstrap", env={**os.environ, "SOURCE_DATE_EPOCH": str(base.epoch)})


def installed_debs(rootfs: Path) -> dict[str, str]:
    """name -> version of every package dpkg says is installed in ``rootfs``."""
    proc = run(["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f", "${db:Status-Status} ${Package} ${Version}\n"],
               what="dpkg-query")
    return {name: version for status, name, version in (line.split() for line in proc.stdout.splitlines())
            if status == "installed"}


def lock_base(*, roots: tuple[str, ...] | None = None) -> Base:
    """Resolve the base anew (``essential`` + roots) and write debian.yaml and the Dockerfile's pins."""
    require_root()
    ensure_tools("mmdebstrap")
    old = Base.load()
    roots = roots or old.roots
    with tempfile.TemporaryDirectory(prefix="images-lock-", dir=ensure_out()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        mmdebstrap(old, target=rootfs, variant="essential", include=list(roots))
        packages = installed_debs(rootfs)
    base = Base(suite=old.suite, mirrors=old.mirrors, roots=tuple(roots), packages=packages, pip=old.pip, epoch=old.epoch)
    write_base(base)
    for dockerfile in DOCKERFILES.values():
        dockerfile.write_text(dockerfile_with_pins(dockerfile.read_text(), base))
    log(f"{len(packages)} packages pinned in {BASE_FILE.relative_to(ROOT)} and "
        f"{', '.join(str(d.relative_to(ROOT)) for d in DOCKERFILES.values())}")
    return base


def write_base(base: Base) -> None:
    header = ("# The Debian base of the images: written by `hack/images.sh lock-base` (mmdebstrap's\n"
              "# essential set of a minimal suite plus `roots`); do not edit `packages` by hand.\n"
              "# The mmdebstrap build installs exactly these versions; the final stages of\n"
              "# images/operator/Dockerfile and images/oracle/Dockerfile pin the same\n"
              "# (tests/unit/test_image_builds.py). `pip` installs the\n"
              "# wheels and is not left in the image; `epoch` is SOURCE_DATE_EPOCH (every file's mtime).\n")
    body = {"suite": base.suite, "mirrors": list(base.mirrors), "roots": list(base.roots), "pip": base.pip,
            "epoch": base.epoch, "packages": dict(sorted(base.packages.items()))}
    BASE_FILE.write_text(header + yaml.safe_dump(body, sort_keys=False, width=200))


def ensure_out() -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    return OUT


# ---------------------------------------------------------------------------------------
# build


def copy_sources(src: Path) -> None:
    """The Dockerfile build stage's COPY sources (SOURCE_PATHS) into ``src``."""
    for path in SOURCE_PATHS:
        dest = src / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / path).is_dir():
            shutil.copytree(ROOT / path, dest, ignore=shutil.ignore_patterns(*IGNORED_INPUTS))
        else:
            shutil.copy2(ROOT / path, dest)


def build_wheels(base: Base, image: str, work: Path, *, fresh: bool = False) -> Path:
    """The wheels of ``image`` under ``work/wheels/{main,nodeps}`` and pip's own wheel under
    ``work/wheels/pip``; ``fresh``: without pip's cache (every wheel downloaded or built anew)."""
    src, wheels = work / "src", work / "wheels"
    copy_sources(src)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(base.epoch), "PYTHONSAFEPATH": "1", "PIP_NO_INPUT": "1"}
    if fresh:
        env["PIP_NO_CACHE_DIR"] = "1"
    for command in wheel_commands(sys.executable, image, wheels, src):
        run(command, what="pip wheel", env=env, cwd=work)
    run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download", "--no-deps",
         "--dest", str(wheels / "pip"), f"pip=={base.pip}"], what="pip download pip", env=env)
    return wheels


#: How pip (run from its wheel) installs the wheels into the image; both Dockerfiles pass the
#: same options (tests/unit/test_image_builds.py): only the built wheels, no bytecode.
PIP_INSTALL_OPTIONS = ("--no-index", "--no-compile", "--no-cache-dir", "--break-system-packages")


def install_wheels(base: Base, image: str, rootfs: Path, wheels: Path, config: ImageConfig) -> None:
    """pip, run from its wheel inside a chroot of ``rootfs``, installs the wheels (no bytecode)."""
    staged = rootfs / "tmp" / "wheels"
    shutil.copytree(wheels, staged)
    (pip_wheel,) = (staged / "pip").glob("pip-*.whl")
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    pip = [chroot, str(rootfs), "/usr/bin/python3", f"/tmp/wheels/pip/{pip_wheel.name}/pip", "install",
           *PIP_INSTALL_OPTIONS, "--disable-pip-version-check", "--root-user-action=ignore", "-q"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "SOURCE_DATE_EPOCH": str(base.epoch), **config.env}
    main = sorted(f"/tmp/wheels/main/{w.name}" for w in (staged / "main").glob("*.whl"))
    run([*pip, *main], what="pip install (in the image)", env=env)
    nodeps = sorted(f"/tmp/wheels/nodeps/{w.name}" for w in (staged / "nodeps").glob("*.whl"))
    if nodeps:
        run([*pip, "--no-deps", *nodeps], what="pip install --no-deps (in the image)", env=env)
    shutil.rmtree(staged)
    if image == "oracle":
        # the CUDA stubs of PyPI's torch, compiled by the host's cc against the image's torch
        site = rootfs / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
        run([sys.executable, str(ROOT / "operator" / "oracle" / "cuda_stubs.py"), str(site)], what="CUDA stubs",
            env={**os.environ, "SOURCE_DATE_EPOCH": str(base.epoch)})


def scrub(rootfs: Path, epoch: int) -> None:
    """Remove what differs between two builds of the same inputs and clamp every mtime to ``epoch``."""
    for pattern in ("var/cache/apt/*", "var/lib/apt/lists/*", "var/log/*", "var/cache/debconf/*-old",
                    "var/cache/ldconfig/aux-cache", "tmp/*", "root/.cache", "etc/machine-id"):
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for path in rootfs.rglob("__pycache__"):
        shutil.rmtree(path)
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (epoch, epoch), follow_symlinks=False)
    os.utime(rootfs, (epoch, epoch))


def make_oci(base: Base, image: str, rootfs: Path, layout: Path, config: ImageConfig, work: Path) -> None:
    """umoci: a one-layer OCI image ``layout:<image>`` from ``rootfs`` with ``config``."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base.epoch))
    ref = f"{layout}:{image}"
    run(["umoci", "init", "--layout", str(layout)], what="umoci init")
    run(["umoci", "new", "--image", ref], what="umoci new")
    bundle = work / "bundle"
    run(["umoci", "unpack", "--image", ref, str(bundle)], what="umoci unpack (empty)")
    shutil.rmtree(bundle / "rootfs")
    os.rename(rootfs, bundle / "rootfs")
    run(["umoci", "repack", "--image", ref, "--history.created", created,
         "--history.created_by", f"hack/images.sh build {image}", str(bundle)], what="umoci repack")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", **config.env}
    command = ["umoci", "config", "--image", ref, "--created", created, "--no-history",
               "--config.user", config.user, "--config.workingdir", "/",
               "--config.label", f"org.opencontainers.image.title=sglang-pd-operator-{image}",
               "--config.label", f"org.opencontainers.image.created={created}"]
    command += [a for e in config.entrypoint for a in ("--config.entrypoint", e)]
    command += [a for c in config.cmd for a in ("--config.cmd", c)]
    command += [a for k, v in sorted(env.items()) for a in ("--config.env", f"{k}={v}")]
    run(command, what="umoci config")
    run(["umoci", "gc", "--layout", str(layout)], what="umoci gc")
    for path in layout.rglob("*"):  # the layout's own files: fixed times too
        os.utime(path, (base.epoch, base.epoch), follow_symlinks=False)


def manifest_of(layout: Path, image: str) -> tuple[str, dict]:
    """(digest, manifest) of the tag ``image`` in the OCI layout."""
    index = json.loads((layout / "index.json").read_text())
    for desc in index["manifests"]:
        if desc.get("annotations", {}).get("org.opencontainers.image.ref.name") == image:
            algo, hexd = desc["digest"].split(":")
            return desc["digest"], json.loads((layout / "blobs" / algo / hexd).read_bytes())
    raise ImageError(f"{layout} has no tag {image}")


def sizes(layout: Path, manifest: dict) -> tuple[int, int]:
    """(compressed bytes: config + layers as stored, uncompressed bytes of the layers)."""
    compressed = manifest["config"]["size"] + sum(layer["size"] for layer in manifest["layers"])
    uncompressed = 0
    for layer in manifest["layers"]:
        algo, hexd = layer["digest"].split(":")
        with gzip.open(layout / "blobs" / algo / hexd) as f:
            while chunk := f.read(1 << 20):
                uncompressed += len(chunk)
    return compressed, uncompressed


def package_list(rootfs: Path) -> dict[str, dict[str, str]]:
    """{"debian": name -> version, "python": name -> version} installed in ``rootfs``."""
    python = {}
    for meta in sorted((rootfs / "usr" / "local" / "lib").glob("python3*/dist-packages/*.dist-info/METADATA")):
        fields = dict(line.split(": ", 1) for line in meta.read_text(errors="replace").split("\n\n")[0].splitlines()
                      if ": " in line and not line.startswith(" "))
        python[normalize(fields["Name"])] = fields["Version"]
    return {"debian": installed_debs(rootfs), "python": python}


def normalize(name: str) -> str:
    """PEP 503's normal form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock_text: str) -> dict[str, str]:
    """name (PEP 503 form) -> version of every ``name==version`` line of a pip constraints file."""
    out = {}
    for line in lock_text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line.strip())
        if m:
            out[normalize(m[1])] = m[2]
    return out


def unlocked_python_packages(installed: dict[str, str], *, image: str) -> list[str]:
    """``name==version`` of every Python distribution in the image that requirements/lock.txt
    (or, for the oracle, its requirement files) does not pin at that version; the project
    itself is checked against pyproject.toml's version. Empty when the build used the lock."""
    pinned = locked_versions(LOCK.read_text())
    if image == "oracle":
        for name in ("sglang-cpu.txt", "sglang-nodeps.txt"):
            pinned.update(locked_versions((ORACLE_REQUIREMENTS / name).read_text()))
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    pinned["sglang-pd-operator"] = project
    return sorted(f"{name}=={version}" for name, version in installed.items() if pinned.get(name) != version)


#: Libraries a shared object may need that the image deliberately lacks: the CUDA driver
#: (the oracle's torch is loaded without a GPU; oracle/cuda_stubs.py leaves it out on purpose).
ABSENT_BY_DESIGN = frozenset({"libcuda.so.1"})


def missing_shared_libraries(rootfs: Path) -> list[str]:
    """``file: library`` for every DT_NEEDED entry (readelf -d) of a shared object under the
    image's dist-packages that no file in the image provides: the loader would fail at import.
    Empty when every library is there (save ABSENT_BY_DESIGN)."""
    site = list(rootfs.glob("usr/local/lib/python3*/dist-packages"))
    provided = set()
    for top in [rootfs / "usr" / "lib", *site]:
        for dirpath, _, filenames in os.walk(top):
            provided.update(filenames)
    objects = sorted(p for top in site for p in top.rglob("*.so*") if p.is_file() and not p.is_symlink())
    missing = []
    for chunk in range(0, len(objects), 200):
        batch = objects[chunk:chunk + 200]
        out = subprocess.run(["readelf", "-d", "-W", *map(str, batch)], capture_output=True, text=True).stdout
        current = None
        for line in out.splitlines():
            if line.startswith("File: "):
                current = line[6:].strip()
            m = re.search(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", line)
            if m and m[1] not in provided and m[1] not in ABSENT_BY_DESIGN:
                name = current or str(batch[0])
                missing.append(f"{Path(name).relative_to(rootfs)}: {m[1]}")
    return missing


def base_rootfs(base: Base, target: Path, *, fresh: bool = False) -> None:
    """The pinned Debian packages in ``target``: mmdebstrap once per debian.yaml, then a copy
    from ``~/.cache/sglang-pd-operator/images/base-<sha256 of debian.yaml>`` (the same debs
    unpacked the same way; renamed into place only when complete). ``fresh``: mmdebstrap
    straight into ``target``, the cache neither read nor written (verify-reproducible)."""
    if fresh:
        mmdebstrap(base, target=target, variant="custom", include=base.pins())
        return
    cache_base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-pd-operator" / "images"
    key = hashlib.sha256(BASE_FILE.read_bytes()).hexdigest()[:16]
    cached = cache_base / f"base-{key}"
    if not cached.is_dir():
        cache_base.mkdir(parents=True, exist_ok=True)
        tmp = cache_base / f".base-{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            mmdebstrap(base, target=tmp, variant="custom", include=base.pins())
            os.rename(tmp, cached)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        log(f"Debian base: cache hit {cached}")
    run(["cp", "-a", str(cached), str(target)], what="copy of the Debian base")


def tree_hash(paths: tuple[str, ...]) -> str:
    """sha256 over every file under ``paths`` (relative to the repository): path and bytes,
    sorted; what copy_sources leaves out (IGNORED_INPUTS) is left out here too."""
    import fnmatch

    digest = hashlib.sha256()
    for top in paths:
        files = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in files:
            rel = path.relative_to(ROOT)
            if not path.is_file() or any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in IGNORED_INPUTS):
                continue
            digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_inputs() -> dict:
    """What the record names as the image's inputs: the sha256 of BUILD_INPUTS, the commit and
    whether those paths differ from it (``dirty``: the hash is the authority, the commit a hint)."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "HEAD") or None
    dirty = bool(git("status", "--porcelain", "--", *BUILD_INPUTS)) if commit else None
    return {"sha256": tree_hash(BUILD_INPUTS), "commit": commit, "dirty": dirty, "paths": list(BUILD_INPUTS)}


def host_tools() -> dict[str, str]:
    """Versions of the host's tools the digest depends on (docs/images.md, "Reproducible")."""
    import platform

    def first_line(*command: str) -> str:
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return "missing"
        return (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else "missing"

    return {"python": platform.python_version(), "glibc": "-".join(platform.libc_ver()),
            "pip": first_line(sys.executable, "-m", "pip", "--version").split(" from ")[0],
            "umoci": first_line("umoci", "--version"), "mmdebstrap": first_line("mmdebstrap", "--version"),
            "tar": first_line("tar", "--version")}


def finals(image: str, out: Path) -> tuple[Path, Path, Path]:
    """The record, the archive and the layout of ``image`` under ``out`` (the record first:
    removed first, written last, so that a record always names complete files)."""
    return out / f"{image}.json", out / f"{image}.oci.tar", out / f"{image}.oci"


def remove_finals(image: str, out: Path) -> None:
    """A build's first step: the previous build's record, archive and layout go, so a build
    that fails leaves no image that looks complete (smoke and push then say there is none)."""
    for final in finals(image, out):
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        elif final.exists() or final.is_symlink():
            final.unlink()


def build(image: str, *, out: Path | None = None, fresh: bool = False) -> dict:
    """Build ``image`` (operator | oracle) into ``out`` (.run/images/); returns the record
    written to <image>.json. ``fresh``: no cached Debian base and no pip cache.

    A build that fails leaves nothing under the final names: the previous build's record,
    archive and layout are removed first; the build works in ``out/.build-<image>-*``; the
    layout and the archive are renamed into place only after every step succeeded, and the
    record (naming the inputs, the digest and the archive's size and sha256) last.
    """
    require_root()
    ensure_tools("mmdebstrap", "umoci")
    base = Base.load()
    config = dockerfile_config(DOCKERFILES[image])
    for dockerfile in DOCKERFILES.values():
        if dockerfile_apt_pins(dockerfile) != base.packages:
            raise ImageError(f"{dockerfile.relative_to(ROOT)}'s apt pins differ from images/base/debian.yaml: "
                             "run `hack/images.sh lock-base`")
    out = out or ensure_out()
    out.mkdir(parents=True, exist_ok=True)
    inputs = build_inputs()
    remove_finals(image, out)
    started = time.monotonic()
    timings = {}
    with tempfile.TemporaryDirectory(prefix=f".build-{image}-", dir=out) as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        wheels = build_wheels(base, image, work, fresh=fresh)
        timings["wheels_s"] = round(time.monotonic() - t0, 1)
        log(f"{image}: wheels built ({timings['wheels_s']} s); mmdebstrap {len(base.packages)} Debian packages"
            + (" (fresh: no cached base)" if fresh else ""))
        t0 = time.monotonic()
        rootfs = work / "rootfs"
        base_rootfs(base, rootfs, fresh=fresh)
        got = installed_debs(rootfs)
        if got != base.packages:
            extra = sorted(set(got.items()) - set(base.packages.items()))
            raise ImageError(f"mmdebstrap installed other packages than debian.yaml pins: {extra[:10]}")
        timings["debian_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        install_wheels(base, image, rootfs, wheels, config)
        packages = package_list(rootfs)
        missing = missing_shared_libraries(rootfs)
        if missing:
            raise ImageError(f"shared libraries the image's Python packages need are not in the image "
                             f"(add their Debian package to images/base/debian.yaml roots, then lock-base): {missing[:10]}")
        unlocked = unlocked_python_packages(packages["python"], image=image)
        if unlocked:
            raise ImageError(f"the image holds Python packages the lock does not pin at those versions: {unlocked}")
        scrub(rootfs, base.epoch)
        timings["install_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        layout = work / f"{image}.oci"
        make_oci(base, image, rootfs, layout, config, work)
        digest, manifest = manifest_of(layout, image)
        archive = work / f"{image}.oci.tar"
        run(["tar", "--sort=name", f"--mtime=@{base.epoch}", "--owner=0", "--group=0", "--numeric-owner",
             "--format=posix", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
             "-cf", str(archive), "-C", str(layout), "."], what="tar (the OCI archive)")
        timings["oci_s"] = round(time.monotonic() - t0, 1)
        compressed, uncompressed = sizes(layout, manifest)
        record = {"image": image, "digest": digest, "compressed_bytes": compressed, "uncompressed_bytes": uncompressed,
                  "archive_bytes": archive.stat().st_size, "archive_sha256": sha256_file(archive),
                  "build_s": round(time.monotonic() - started, 1), **timings, "fresh": fresh,
                  "inputs": inputs, "host": host_tools(), "packages": packages}
        partial = work / f"{image}.json"
        partial.write_text(json.dumps(record, indent=1) + "\n")
        record_path, final_archive, final_layout = finals(image, out)
        os.rename(layout, final_layout)
        os.rename(archive, final_archive)
        os.rename(partial, record_path)
    return record


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def summary(record: dict, out: Path | None = None) -> str:
    out = out or OUT
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    inputs = record.get("inputs") or {}
    commit = (inputs.get("commit") or "no commit")[:12] + ("+changes" if inputs.get("dirty") else "")
    return (f"{record['image']}: {record['digest']}  {record['compressed_bytes'] / 1e6:,.1f} MB compressed, "
            f"{record['uncompressed_bytes'] / 1e6:,.0f} MB uncompressed; built in {record['build_s']:.0f} s "
            f"(wheels {record['wheels_s']:.0f} s, Debian {record['debian_s']:.0f} s, install {record['install_s']:.0f} s, "
            f"OCI {record['oci_s']:.0f} s) from {commit} (inputs {inputs.get('sha256', '?')[:16]}) "
            f"-> {where}/{record['image']}.oci.tar")


def layout_blobs(layout: Path) -> set[str]:
    """The digests of every blob in an OCI layout (``sha256:<hex>``)."""
    return {f"{p.parent.name}:{p.name}" for p in (layout / "blobs").glob("*/*") if p.is_file()}


def verify_reproducible(image: str) -> dict:
    """Build ``image`` twice from nothing (no cached Debian base: mmdebstrap each time; no pip
    cache) into .run/images/reproducible/<image>/{1,2}/ and compare the full digests and the
    archives' sha256. Writes and returns the result (result.json there); raises ImageError
    naming the blobs that differ when the two builds differ (both kept for diffoscope).
    The builds do not touch .run/images/<image>.* (the image smoke and push use)."""
    top = ensure_out() / "reproducible" / image
    shutil.rmtree(top, ignore_errors=True)
    builds, t0, started = [], time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for n in (1, 2):
        out = top / str(n)
        record = build(image, out=out, fresh=True)
        print(summary(record, out), flush=True)
        builds.append(record)
    first, second = builds
    same = first["digest"] == second["digest"] and first["archive_sha256"] == second["archive_sha256"]
    result = {"image": image, "reproducible": same, "inputs": first["inputs"], "host": first["host"],
              "started": started,
              "total_s": round(time.monotonic() - t0, 1),
              "builds": [{k: r[k] for k in ("digest", "archive_sha256", "compressed_bytes", "uncompressed_bytes",
                                             "build_s", "wheels_s", "debian_s", "install_s", "oci_s")} for r in builds]}
    if first["inputs"]["sha256"] != second["inputs"]["sha256"]:
        raise ImageError("the inputs changed between the two builds (a file under "
                         f"{', '.join(BUILD_INPUTS)} was edited): nothing was compared")
    (top / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    if not same:
        a, b = (layout_blobs(finals(image, top / str(n))[2]) for n in (1, 2))
        raise ImageError(f"{image} is not reproducible: {first['digest']} then {second['digest']}; blobs only in the "
                         f"first: {sorted(a - b)}, only in the second: {sorted(b - a)} (both builds kept under {top}; "
                         "compare the layers with diffoscope)")
    shutil.rmtree(top / "2")  # the same bytes twice: the first build's files stay
    log(f"{image}: reproducible, {first['digest']} twice from nothing (builds {first['build_s']:.0f} s and "
        f"{second['build_s']:.0f} s); {top / 'result.json'}")
    return result


# ---------------------------------------------------------------------------------------
# smoke: the image's root filesystem under runc, read-only, as 65532

CHART = ROOT / "charts" / "sglang-pd-operator"
SMOKE_EXAMPLE = ROOT / "examples" / "qwen3-30b-a3b-paged-experts.yaml"
#: The oracle image's smoke: its own command (images/oracle/Dockerfile: ``oracle serve``) on
#: a free loopback port, warm for the example's accelerator; SMOKE_EXAMPLE POSTed to the
#: service's verdict API (operator/oracle/service.py) once ``/readyz`` answers 200.
ORACLE_VERDICT_PATH = "/v1/verdict"
ORACLE_READY_TIMEOUT_S = 900
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
READY_TIMEOUT_S = 300


def record_of(image: str, *, out: Path | None = None) -> dict:
    """The record of the built ``image`` under ``out`` (.run/images/); raises ImageError when
    there is none (never built, or the last build failed or is running), when its files are
    incomplete, or when it was built from other inputs than the tree's (record_problems)."""
    out = out or OUT
    path = finals(image, out)[0]
    if not path.is_file():
        raise ImageError(f"no built {image} image under {out} (none was built, or the last build failed "
                         f"or is still running): run `hack/images.sh build {image}`")
    record = json.loads(path.read_text())
    problems = record_problems(record, image, out, inputs_sha256=tree_hash(BUILD_INPUTS))
    if problems:
        raise ImageError(f"the {image} image under {out} cannot be used: " + "; ".join(problems) +
                         f". Run `hack/images.sh build {image}`")
    return record


def record_problems(record: dict, image: str, out: Path, *, inputs_sha256: str) -> list[str]:
    """Why a record does not describe a complete image of the current inputs: it names no
    inputs or other ones (a stale image), or its layout or archive is missing or is not the
    one it names. Empty when it may be smoked and pushed (push also checks the archive's sha256)."""
    _, archive, layout = finals(image, out)
    problems = []
    inputs = record.get("inputs")
    if not isinstance(inputs, dict) or "sha256" not in inputs:
        problems.append("its record names no inputs (built before records did)")
    elif inputs["sha256"] != inputs_sha256:
        commit = (inputs.get("commit") or "no commit")[:12] + (" with changes" if inputs.get("dirty") else "")
        problems.append(f"it is stale: built from other inputs ({commit}, inputs {inputs['sha256'][:16]}) than "
                        f"the tree's ({inputs_sha256[:16]}; {', '.join(BUILD_INPUTS)})")
    if not (layout / "index.json").is_file():
        problems.append(f"its layout {layout.name} is missing or incomplete")
    else:
        try:
            digest = manifest_of(layout, image)[0]
        except (ImageError, OSError, ValueError) as err:
            problems.append(f"its layout {layout.name} is unreadable ({err})")
        else:
            if digest != record.get("digest"):
                problems.append(f"its layout holds {digest}, not the recorded {record.get('digest')}")
    if not archive.is_file():
        problems.append(f"its archive {archive.name} is missing")
    elif archive.stat().st_size != record.get("archive_bytes"):
        problems.append(f"its archive {archive.name} has {archive.stat().st_size} bytes, "
                        f"not the recorded {record.get('archive_bytes')}")
    return problems


def unpack_bundle(image: str, bundle: Path) -> dict:
    """umoci unpack of the built image into ``bundle``; returns the runtime spec (config.json)."""
    run(["umoci", "unpack", "--image", f"{finals(image, OUT)[2]}:{image}", str(bundle)], what="umoci unpack")
    return json.loads((bundle / "config.json").read_text())


def entrypoint_problems(rootfs: Path, argv: list[str], env: list[str]) -> list[str]:
    """What the image lacks to start ``argv``: the program on the image's PATH, its ``#!``
    interpreter, and (for a Python console script) the module it imports. Empty when complete."""
    path = next((e.split("=", 1)[1] for e in env if e.startswith("PATH=")), "/usr/bin:/bin")
    program = argv[0]
    candidates = [program] if program.startswith("/") else [f"{d}/{program}" for d in path.split(":")]
    found = next((c for c in candidates if (rootfs / c.lstrip("/")).is_file()), None)
    if not found:
        return [f"{program} (the entrypoint) is not on the image's PATH {path}"]
    problems = []
    head = (rootfs / found.lstrip("/")).read_bytes()[:4096].decode(errors="replace")
    if head.startswith("#!"):
        interpreter = head[2:].split("\n", 1)[0].split()[0]
        if not (rootfs / interpreter.lstrip("/")).exists():
            problems.append(f"{found}'s interpreter {interpreter} is missing")
        m = re.search(r"^from ([\w.]+) import", head, re.M)
        if m:
            module = m[1].replace(".", "/")
            hits = list(rootfs.glob(f"usr/local/lib/python3*/dist-packages/{module}.py")) + \
                list(rootfs.glob(f"usr/local/lib/python3*/dist-packages/{module}/__init__.py"))
            if not hits:
                problems.append(f"{found} imports {m[1]}, which is not installed in the image")
    return problems


def runtime_spec(spec: dict, *, args: list[str], env: dict[str, str], binds: list[tuple[Path, str]]) -> dict:
    """The umoci-generated runtime spec made into the chart's pod: read-only root, user
    65532:65532, a /tmp tmpfs (the chart's emptyDir), ``binds`` mounted read-only, the
    host's network (the dev cluster listens on loopback), no terminal."""
    spec = json.loads(json.dumps(spec))
    process = spec["process"]
    process["args"] = args
    process["terminal"] = False
    process["user"] = {"uid": 65532, "gid": 65532}
    process["cwd"] = "/"
    base_env = dict(e.split("=", 1) for e in process.get("env", []))
    process["env"] = [f"{k}={v}" for k, v in {**base_env, "HOME": "/tmp", **env}.items()]
    spec["root"]["readonly"] = True
    spec["mounts"] = [m for m in spec.get("mounts", []) if m["destination"] != "/tmp"] + [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=512m"]},
        *({"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "ro"]} for src, dest in binds)]
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] not in ("network", "user")]
    return spec


class Container:
    """One runc container from a built image; ``start`` runs it in the background (output to a log)."""

    def __init__(self, image: str, work: Path, *, args: list[str], env: dict[str, str], binds: list[tuple[Path, str]]):
        self.image, self.work = image, work
        self.name = f"sglang-pd-smoke-{image}-{os.getpid()}"
        self.bundle = work / "bundle"
        self.log_path = work / f"{image}.log"
        spec = unpack_bundle(image, self.bundle)
        problems = entrypoint_problems(self.bundle / "rootfs", args, spec["process"].get("env", []))
        if problems:
            raise ImageError(f"the {image} image cannot start {args[0]}: " + "; ".join(problems))
        spec = runtime_spec(spec, args=args, env=env, binds=binds)
        (self.bundle / "config.json").write_text(json.dumps(spec, indent=1))
        self.state = work / "runc-state"
        self.proc: subprocess.Popen | None = None

    def runc(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.state), *args]

    def start(self) -> "Container":
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.runc("run", "--bundle", str(self.bundle), self.name),
                                     stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def run(self, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(self.runc("run", "--bundle", str(self.bundle), self.name), capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run(self.runc("kill", self.name, "TERM"), capture_output=True)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subprocess.run(self.runc("kill", self.name, "KILL"), capture_output=True)
                self.proc.wait(timeout=10)
        subprocess.run(self.runc("delete", "--force", self.name), capture_output=True)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:]) if self.log_path.exists() else ""


def smoke(image: str) -> dict:
    """Start the built ``image`` with runc (read-only root, user 65532); raise ImageError when it fails."""
    require_root()
    ensure_tools("umoci", "runc")
    record = record_of(image)
    with tempfile.TemporaryDirectory(prefix=f".smoke-{image}-", dir=ensure_out()) as tmp:
        return (smoke_operator if image == "operator" else smoke_oracle)(record, Path(tmp))


def oracle_serve_args(cmd: list[str], *, port: int, accelerator: str) -> list[str]:
    """The oracle image's command (``oracle serve ...`` from its Dockerfile) listening on
    127.0.0.1:``port`` and warming ``accelerator``: the Dockerfile's options stay, these
    follow them (click keeps the last value of an option). Raises ImageError when the
    command is not ``oracle serve``."""
    if cmd[:2] != ["oracle", "serve"]:
        raise ImageError(f"images/oracle/Dockerfile's CMD is {cmd}, not `oracle serve ...`: the smoke asks the service")
    return [*cmd, "--host", "127.0.0.1", "--port", str(port), "--warm", accelerator]


def oracle_request(example: Path) -> tuple[dict, bytes]:
    """The PDDeployment in ``example`` (YAML) and the body of POST /v1/verdict asking for its verdict."""
    doc = yaml.safe_load(example.read_text())
    return doc, json.dumps({"object": doc, "catalogOverrides": None}).encode()


def verdict_problems(status: int, answer: dict) -> list[str]:
    """What is wrong with the service's answer to a valid example: not 200, not valid, or
    SGLang's verdict (``sglang``) not accepted (refused or indeterminate). Empty when good."""
    if status != 200:
        return [f"POST {ORACLE_VERDICT_PATH} answered {status}: {answer}"]
    problems = []
    if answer.get("valid") is not True:
        problems.append(f"valid is {answer.get('valid')!r}: {answer.get('problems')}")
    verdict = answer.get("sglang")
    if not isinstance(verdict, dict):
        problems.append(f"no SGLang verdict (key sglang) in {sorted(answer)}")
    elif verdict.get("accepted") is not True:
        problems.append(f"SGLang's verdict is accepted={verdict.get('accepted')!r}: "
                        f"prefill {verdict.get('prefill')}, decode {verdict.get('decode')}, pair {verdict.get('pair')}")
    return problems


def smoke_oracle(record: dict, work: Path) -> dict:
    """The oracle image serves (``oracle serve``, its Dockerfile's command) and answers
    SGLang's verdict on SMOKE_EXAMPLE through POST /v1/verdict."""
    from sglang_pd_operator_dev.cluster import demo

    config = dockerfile_config(ORACLE_DOCKERFILE)
    doc, body = oracle_request(SMOKE_EXAMPLE)
    accelerator = doc["spec"]["accelerator"]
    port = demo.free_port()
    url = f"http://127.0.0.1:{port}"
    container = Container("oracle", work, args=[*config.entrypoint, *oracle_serve_args(config.cmd, port=port,
                                                                                       accelerator=accelerator)],
                          env={}, binds=[])
    try:
        t0 = time.monotonic()
        container.start()
        deadline = t0 + ORACLE_READY_TIMEOUT_S
        while True:
            if not container.alive():
                raise ImageError(f"the oracle image exited before /readyz answered 200:\n{container.tail(40)}")
            if time.monotonic() > deadline:
                raise ImageError(f"the oracle image's /readyz not 200 after {ORACLE_READY_TIMEOUT_S} s:\n{container.tail(40)}")
            try:
                if http_get(url + "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        ready_s = time.monotonic() - t0
        t1 = time.monotonic()
        status, answer = http_post_json(url + ORACLE_VERDICT_PATH, body, timeout=600)
        verdict_s = time.monotonic() - t1
        print(json.dumps(answer, indent=1))
        problems = verdict_problems(status, answer)
        if problems:
            raise ImageError("the oracle image's verdict on " + SMOKE_EXAMPLE.name + ": " + "; ".join(problems) +
                             f"\n--- container log ---\n{container.tail(40)}")
        log(f"oracle smoke: `{' '.join(container_args(container))}` ready in {ready_s:.1f} s; POST {ORACLE_VERDICT_PATH} "
            f"({SMOKE_EXAMPLE.name}) answered accepted in {verdict_s:.1f} s; read-only root, uid 65532")
        return {"image": "oracle", "digest": record["digest"], "ready_s": round(ready_s, 1),
                "verdict_s": round(verdict_s, 1)}
    finally:
        container.stop()


def container_args(container: "Container") -> list[str]:
    """The process arguments the container was started with (its runtime spec)."""
    return json.loads((container.bundle / "config.json").read_text())["process"]["args"]


def smoke_operator(record: dict, work: Path) -> dict:
    """The operator image runs ``run`` (the chart's arguments) against a dev cluster as the
    chart's ServiceAccount and reconciles SMOKE_EXAMPLE to Ready."""
    from sglang_pd_operator_dev.cluster import cluster as devcluster
    from sglang_pd_operator_dev.cluster import components, demo, teardown

    run_dir = work / "cluster"
    started = time.monotonic()
    cl = devcluster.start_cluster(run_dir=run_dir, log=lambda line: log(line), lws=False)
    container = None
    try:
        demo.install_crds(cl, log=log)
        ns, release = "sglang-system", "pd"
        sa = f"{release}-sglang-pd-operator"
        metrics_port = demo.free_port()
        cl.helm("install", release, str(CHART), "--namespace", ns, "--create-namespace", "--set", "crds.install=false",
                "--set", f"image.repository={registry_address() or '127.0.0.1'}/{REPOSITORIES['operator']}",
                "--set", f"image.digest={record['digest']}",
                "--set", f"metrics.port={metrics_port}")
        dep = json.loads(cl.kubectl("get", "deployment", sa, "-n", ns, "-o", "json").stdout)
        (spec,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
        env = {e["name"]: e["value"] for e in spec.get("env", []) if "value" in e}
        env.update(POD_NAME="smoke-runc", POD_NAMESPACE=ns)
        secrets = work / "serviceaccount"
        secrets.mkdir()
        (secrets / "token").write_text(cl.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip())
        shutil.copy(components.Layout(run_dir=Path(cl.run_dir)).pki.ca_cert, secrets / "ca.crt")
        (secrets / "namespace").write_text(ns)
        host, port = cl.server.removeprefix("https://").rsplit(":", 1)
        env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
        config = dockerfile_config()
        container = Container("operator", work, args=[*config.entrypoint, *spec["args"]], env=env,
                              binds=[(secrets, SA_DIR)])
        demo.prepare_namespace(cl, "inference", log=log)
        container.start()
        t_start = time.monotonic()
        applied = cl.kubectl("apply", "--server-side", "-f", str(SMOKE_EXAMPLE)).stdout.strip()
        log(f"operator smoke: {applied}")
        doc = yaml.safe_load(SMOKE_EXAMPLE.read_text())
        name, app_ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = None
        while time.monotonic() < deadline and container.alive():
            obj = json.loads(cl.kubectl("get", "pdd", name, "-n", app_ns, "-o", "json").stdout)
            conds = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
            if conds.get("Ready", {}).get("status") == "True" and \
                    obj["status"].get("observedGeneration") == obj["metadata"]["generation"]:
                ready = obj
                break
            time.sleep(1)
        ready_s = time.monotonic() - t_start
        if ready is None:
            why = "the container exited" if not container.alive() else f"not Ready after {READY_TIMEOUT_S} s"
            raise ImageError(f"operator smoke: {app_ns}/{name} {why}\n--- container log ---\n{container.tail(40)}")
        lease = json.loads(cl.kubectl("get", "lease", "-n", ns, "-o", "json").stdout)["items"]
        holders = sorted(item["spec"].get("holderIdentity", "") for item in lease)
        whoami = [line for line in container.log_path.read_text(errors="replace").splitlines() if "403" in line]
        print(cl.kubectl("get", "pdd", "-n", app_ns).stdout.rstrip())
        print("--- operator container log (first lines) ---")
        print("\n".join(container.log_path.read_text(errors="replace").splitlines()[:12]))
        if not any(h.startswith("smoke-runc") for h in holders):
            raise ImageError(f"operator smoke: the Lease is held by {holders}, not by the container (POD_NAME=smoke-runc)")
        if whoami:
            raise ImageError("operator smoke: the chart's ServiceAccount was refused (403):\n" + "\n".join(whoami[:5]))
        log(f"operator smoke: {app_ns}/{name} Ready {ready_s:.1f} s after apply (container started "
            f"{t_start - started:.0f} s after the cluster began); Lease holder {holders}; read-only root, uid 65532")
        return {"image": "operator", "digest": record["digest"], "ready_after_apply_s": round(ready_s, 1)}
    finally:
        if container is not None:
            container.stop()
        teardown.stop_run(run_dir, quiet=True)


# ---------------------------------------------------------------------------------------
# the local registry, push, and the chart's digest

REGISTRY_DIR = OUT / "registry"
REPOSITORIES = {"operator": "sglang-pd-operator", "oracle": "sglang-pd-operator-oracle"}
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def registry_binary() -> Path:
    """The Distribution registry built from hack/images/registry/go.mod (cached; hack/gotool.py):
    build_registry.py's REGISTRY. Raises ImageError when ``go`` is missing or the build fails."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_registry", ROOT / "hack" / "images" / "registry" / "build_registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)                  # puts hack/ on sys.path for gotool
    from gotool import GoToolBuildError

    try:
        return module.REGISTRY.ensure(log=log)
    except GoToolBuildError as err:
        raise ImageError(str(err)) from err


def http_get(url: str, *, accept: str | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def http_post_json(url: str, body: bytes, *, timeout: float) -> tuple[int, dict]:
    """POST ``body`` (JSON) to ``url``; returns the status and the answer's JSON ({"raw": text} when not JSON)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"raw": raw.decode(errors="replace")[:2000]}


def registry_address() -> str | None:
    """``127.0.0.1:PORT`` of the running local registry (its /v2/ answers), else None."""
    addr_file = REGISTRY_DIR / "address"
    if not addr_file.is_file():
        return None
    addr = addr_file.read_text().strip()
    try:
        status, _, _ = http_get(f"http://{addr}/v2/")
    except OSError:
        return None
    return addr if status == 200 else None


def ensure_registry() -> str:
    """Start the registry on loopback (storage under .run/images/registry/) unless it runs; its address."""
    addr = registry_address()
    if addr:
        return addr
    binary = registry_binary()
    from sglang_pd_operator_dev.cluster.demo import free_port

    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    addr = f"127.0.0.1:{free_port()}"
    config = {"version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
              "storage": {"filesystem": {"rootdirectory": str(REGISTRY_DIR / "data")}, "delete": {"enabled": True}},
              "http": {"addr": addr}}
    (REGISTRY_DIR / "config.yml").write_text(yaml.safe_dump(config))
    with open(REGISTRY_DIR / "registry.log", "ab") as out:
        proc = subprocess.Popen([str(binary), "serve", str(REGISTRY_DIR / "config.yml")], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (REGISTRY_DIR / "pid").write_text(str(proc.pid))
    (REGISTRY_DIR / "address").write_text(addr)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ImageError(f"the registry exited ({proc.returncode}); see {REGISTRY_DIR / 'registry.log'}")
        if registry_address():
            log(f"registry: serving http://{addr}/v2/ (pid {proc.pid}, {REGISTRY_DIR})")
            return addr
        time.sleep(0.2)
    raise ImageError(f"the registry did not answer http://{addr}/v2/ within 30 s")


def stop_registry() -> None:
    """Stop the registry this tool started (its recorded pid only)."""
    pid_file = REGISTRY_DIR / "pid"
    if pid_file.is_file():
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
        pid_file.unlink()
        (REGISTRY_DIR / "address").unlink(missing_ok=True)


def push_source(image: str) -> str:
    """What push copies: the built archive, ``oci-archive:.run/images/<image>.oci.tar`` (the
    READMEs' ``skopeo copy`` source; relative to the repository, where skopeo runs)."""
    archive = finals(image, OUT)[1]
    return f"oci-archive:{archive.relative_to(ROOT) if archive.is_relative_to(ROOT) else archive}"


def push(image: str) -> dict:
    """skopeo copies the built image's archive (``oci-archive:.run/images/<image>.oci.tar``, the
    READMEs' command) to the local registry; the pushed digest must be the built one."""
    ensure_tools("skopeo")
    record = record_of(image)
    _, archive, _ = finals(image, OUT)
    if sha256_file(archive) != record["archive_sha256"]:
        raise ImageError(f"{archive} is not the archive its build recorded (sha256 differs): rebuild")
    addr = ensure_registry()
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    dest = f"{addr}/{REPOSITORIES[image]}:{version}"
    source = push_source(image)
    with tempfile.TemporaryDirectory() as tmp:
        digest_file = Path(tmp) / "digest"
        t0 = time.monotonic()
        # the registry is plain HTTP on loopback; a real registry needs no --dest-tls-verify
        run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--digestfile", str(digest_file),
             source, f"docker://{dest}"], what="skopeo copy", cwd=ROOT)
        pushed = digest_file.read_text().strip()
    if pushed != record["digest"]:
        raise ImageError(f"the registry holds {pushed}, not the built {record['digest']} (skopeo changed the manifest)")
    log(f"pushed {source} to {dest}@{pushed} in {time.monotonic() - t0:.1f} s")
    return {"image": image, "reference": f"{addr}/{REPOSITORIES[image]}@{pushed}", "tag": dest, "source": source}


def chart_args(repository: str, digest: str, *, oracle: tuple[str, str] | None = None) -> list[str]:
    """The ``--set`` options that pin the chart's images by digest (the READMEs' commands):
    the operator's, and with ``oracle`` (repository, digest) the oracle service's too."""
    args = ["--set", f"image.repository={repository}", "--set", f"image.digest={digest}"]
    if oracle:
        args += ["--set", "oracle.enabled=true", "--set", f"oracle.image.repository={oracle[0]}",
                 "--set", f"oracle.image.digest={oracle[1]}"]
    return args


def chart_check(addr: str, digest: str, *, oracle_digest: str | None = None) -> list[str]:
    """The chart rendered with image.repository/image.digest (and with ``oracle_digest``
    oracle.enabled and oracle.image.repository/digest) names manifests the registry serves
    (its HTTP API: each manifest by digest, then its config and every layer). Returns the images."""
    from sglang_pd_operator_dev.cluster import build as cluster_build

    helm = cluster_build.ensure_binaries(log=log).path("helm")
    repository = f"{addr}/{REPOSITORIES['operator']}"
    expected = [f"{repository}@{digest}"]
    oracle = None
    if oracle_digest:
        oracle = (f"{addr}/{REPOSITORIES['oracle']}", oracle_digest)
        expected.append(f"{oracle[0]}@{oracle_digest}")
    rendered = run([str(helm), "template", "pd", str(CHART), "--namespace", "sglang-system",
                    *chart_args(repository, digest, oracle=oracle)], what="helm template").stdout
    images = sorted(c["image"] for doc in yaml.safe_load_all(rendered) if doc and doc.get("kind") == "Deployment"
                    for c in doc["spec"]["template"]["spec"]["containers"])
    if images != sorted(expected):
        raise ImageError(f"the chart renders {images}, expected {sorted(expected)}")
    for ref in images:
        host, _, rest = ref.partition("/")
        name, _, ref_digest = rest.partition("@")
        status, headers, body = http_get(f"http://{host}/v2/{name}/manifests/{ref_digest}", accept=OCI_MANIFEST)
        if status != 200 or headers.get("Docker-Content-Digest") != ref_digest:
            raise ImageError(f"the registry does not serve {ref}: HTTP {status} {body[:200]!r}")
        manifest = json.loads(body)
        for blob in [manifest["config"], *manifest["layers"]]:
            status, _, _ = http_get(f"http://{host}/v2/{name}/blobs/{blob['digest']}", method="HEAD")
            if status != 200:
                raise ImageError(f"the registry lacks blob {blob['digest']} of {ref} (HTTP {status})")
        log(f"chart: image {ref} resolves in the registry (manifest, config and {len(manifest['layers'])} layer(s))")
    return images


# ---------------------------------------------------------------------------------------
# ci: rebuild and check only when an input changed

CI_INPUTS = ("images", "operator", "kernels", "pyproject.toml", "README.md", "requirements/lock.txt", "hack/images",
             "charts")


def inputs_hash() -> str:
    """sha256 over every file of CI_INPUTS (path and bytes; IGNORED_INPUTS left out)."""
    return tree_hash(CI_INPUTS)


def ci(*, oracle: bool = False) -> int:
    """Build, smoke, push and chart-check the operator image (and with ``oracle`` the oracle
    image) when an input changed since the last green run on this machine (a stamp in the
    cache); print the figures and a closing ``images: N passed, 0 failed`` line."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sglang-pd-operator" / "images"
    names = ["operator", "oracle"] if oracle else ["operator"]
    key = inputs_hash() + "-".join(names)
    stamp = cache / f"ci-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if stamp.is_file():
        log(f"ci: the inputs ({', '.join(CI_INPUTS)}) are unchanged since a green run ({stamp}); nothing to rebuild")
        print(stamp.read_text().rstrip())
        print(f"images: {3 * len(names) + 1} passed, 0 failed (unchanged since that run)")
        return 0
    results: dict = {}
    t0 = time.monotonic()
    try:
        for image in names:
            record = build(image)
            print(summary(record))
            results[image] = {k: v for k, v in record.items() if k != "packages"}
            results[image]["smoke"] = smoke(image)
            results[image]["push"] = push(image)
        results["chart"] = chart_check(ensure_registry(), results["operator"]["digest"],
                                       oracle_digest=results.get("oracle", {}).get("digest"))
    except ImageError:
        print(f"images: {len(results)} passed, 1 failed")
        raise
    finally:
        stop_registry()
    results["total_s"] = round(time.monotonic() - t0, 1)
    cache.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    print(f"images: {3 * len(names) + 1} passed, 0 failed (build, smoke, push per image; the chart's digest)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/images.sh", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("lock-base", help="resolve the Debian base anew: images/base/debian.yaml and the Dockerfile's pins")
    b = sub.add_parser("build", help="build an image into .run/images/")
    b.add_argument("image", choices=["operator", "oracle"])
    s = sub.add_parser("smoke", help="start a built image with runc (read-only root, user 65532)")
    s.add_argument("image", choices=["operator", "oracle"])
    pu = sub.add_parser("push", help="push built images to the local registry (started on loopback if needed)")
    pu.add_argument("images", nargs="*", choices=["operator", "oracle"], default=["operator"])
    cc = sub.add_parser("chart-check", help="the chart with image.repository/digest names an image the registry serves")
    cc.add_argument("--oracle", action="store_true", help="also pin the oracle image (oracle.image.repository/digest)")
    vr = sub.add_parser("verify-reproducible", help="build an image twice from nothing (no cached base) and compare digests")
    vr.add_argument("image", choices=["operator", "oracle"])
    sub.add_parser("registry-stop", help="stop the local registry this tool started")
    c = sub.add_parser("ci", help="build, smoke, push and chart-check when an input changed (what .ci/run runs)")
    c.add_argument("--oracle", action="store_true", help="the oracle image too (cold: about 15 min more)")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock-base":
            lock_base()
        elif args.command == "build":
            print(summary(build(args.image)))
        elif args.command == "smoke":
            print(json.dumps(smoke(args.image)))
        elif args.command == "push":
            for image in args.images:
                print(json.dumps(push(image)))
        elif args.command == "chart-check":
            oracle_digest = record_of("oracle")["digest"] if args.oracle else None
            print("\n".join(chart_check(ensure_registry(), record_of("operator")["digest"], oracle_digest=oracle_digest)))
        elif args.command == "verify-reproducible":
            print(json.dumps(verify_reproducible(args.image), indent=1))
        elif args.command == "registry-stop":
            stop_registry()
        elif args.command == "ci":
            return ci(oracle=args.oracle)
    except ImageError as err:
        print(f"images: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
