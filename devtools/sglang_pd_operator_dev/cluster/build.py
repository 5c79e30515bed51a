"""Build the dev cluster's eight binaries once, into a cache keyed by the Go modules.

One ``go build`` invocation compiles etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, kwok and helm from ``hack/cluster/go.mod``, so the packages they
share are compiled once. A second one compiles the LeaderWorkerSet controller
(``lws-controller``, sigs.k8s.io/lws ``cmd/``) from its own module ``hack/cluster/lws/``
(its tools.go says why it is a module apart), and the LWS module's own manifests the
harness installs (``config/crd/bases``, ``config/webhook``, ``config/rbac/role.yaml``) are
copied unchanged beside it into ``lws-config/``. The output lands in
``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/cluster-bin/<hash>/`` where ``<hash>``
is the sha256 of both modules' go.mod, go.sum and Go sources: a second call finds it
and builds nothing ("cache hit"). The build writes into a temporary sibling directory
and renames it into place, so an interrupted build never leaves a half-filled cache; a
file lock serialises two concurrent builds of the same hash.

``SGLANG_PD_CLUSTER_BIN_DIR`` names a directory of prebuilt binaries and skips all this.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_pd_operator_dev.cluster import gomod, paths, procs

#: Binary name -> the Go package that builds it (relative to hack/cluster's module).
TARGETS: dict[str, str] = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
    "helm": "helm.sh/helm/v3/cmd/helm",
}
#: Binary name -> Go package, built from hack/cluster/lws's module (a second go build).
LWS_TARGETS: dict[str, str] = {"lws-controller": "sigs.k8s.io/lws/cmd"}
#: The LeaderWorkerSet Go module.
LWS_MODULE = "sigs.k8s.io/lws"
#: Folder of the binary directory holding the LWS module's manifests, copied unchanged:
#: destination -> path inside the module (a directory's *.yaml files, or one file).
LWS_CONFIG_DIR = "lws-config"
LWS_CONFIG_FILES: dict[str, str] = {
    "crd": "config/crd/bases",
    "webhook": "config/webhook",
    "rbac/role.yaml": "config/rbac/role.yaml",
}
#: Kueue (optional, ``kueue=True`` clusters): binary name -> Go package, built from hack/cluster/kueue's
#: module into its own cache directory (``kueue-bin/<hash>/``), so the eight core binaries' cache key
#: does not move and a cluster without Kueue never waits for its build.
KUEUE_TARGETS: dict[str, str] = {"kueue-controller": "sigs.k8s.io/kueue/cmd/kueue"}
KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_CONFIG_DIR = "kueue-config"
#: destination -> path inside the Kueue module (a directory's *.yaml files, or one file).
KUEUE_CONFIG_FILES: dict[str, str] = {
    "crd/bases": "config/components/crd/bases",
    "crd/patches": "config/components/crd/patches",
    "crd/kustomization.yaml": "config/components/crd/kustomization.yaml",
    "webhook": "config/components/webhook",
    "rbac/role.yaml": "config/components/rbac/role.yaml",
    "rbac/manager_secrets_role.yaml": "config/components/rbac/manager_secrets_role.yaml",
}
#: How often a running build prints a "still building" line, in seconds.
PROGRESS_EVERY_S = 20.0
_MANIFEST = "build.json"

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """The binaries could not be built or found; the message says why and what to do."""


@dataclass(frozen=True)
class Binaries:
    """A directory holding all eight binaries (TARGETS and LWS_TARGETS) and ``lws-config/``.

    ``cached`` is True when nothing was built by this call; ``build_seconds`` is the
    wall time of the build this call ran (None on a cache hit or with prebuilt binaries)
    and ``packages_compiled`` how many Go packages it compiled (0 when Go's own build
    cache was warm and only linking was needed).
    """

    dir: Path
    cached: bool
    build_seconds: float | None = None
    packages_compiled: int | None = None

    def path(self, name: str) -> Path:
        """Absolute path of one binary, e.g. ``path("kubectl")``."""
        return self.dir / name

    @property
    def lws_config(self) -> Path:
        """The LWS module's manifests (crd/, webhook/, rbac/role.yaml), as the module has them."""
        return self.dir / LWS_CONFIG_DIR


@dataclass(frozen=True)
class KueueBinaries:
    """A directory holding ``kueue-controller`` and ``kueue-config/`` (Kueue's manifests, unchanged).

    ``cached``, ``build_seconds``, ``packages_compiled``: as :class:`Binaries`.
    """

    dir: Path
    cached: bool
    build_seconds: float | None = None
    packages_compiled: int | None = None

    def path(self, name: str) -> Path:
        """Absolute path of one binary (``kueue-controller``)."""
        return self.dir / name

    @property
    def config(self) -> Path:
        """Kueue's manifests: crd/bases, crd/patches, webhook/, rbac/role.yaml."""
        return self.dir / KUEUE_CONFIG_DIR


def kueue_module_hash(source: Path) -> str:
    """sha256 (hex) of ``source``'s ``kueue/`` module (go.mod, go.sum, its Go files) and of what the build
    produces from it (KUEUE_TARGETS, KUEUE_CONFIG_FILES): a change of either builds a new directory."""
    digest = hashlib.sha256(json.dumps([KUEUE_TARGETS, KUEUE_CONFIG_FILES], sort_keys=True).encode())
    kueue = source / "kueue"
    for file in [kueue / "go.mod", kueue / "go.sum", *sorted(kueue.glob("*.go"))]:
        digest.update(str(file.relative_to(source)).encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def missing_kueue(directory: Path) -> list[str]:
    """Names of KUEUE_TARGETS that are not executable in ``directory``, plus ``kueue-config`` when incomplete."""
    missing = [n for n in KUEUE_TARGETS if not os.access(directory / n, os.X_OK)]
    if not (directory / KUEUE_CONFIG_DIR / "webhook" / "manifests.yaml").is_file():
        missing.append(KUEUE_CONFIG_DIR)
    return missing


def find_kueue() -> KueueBinaries | None:
    """Kueue without building: in SGLANG_PD_CLUSTER_BIN_DIR when it holds it, else a cache hit, else None."""
    override = os.environ.get(paths.BIN_DIR_ENV)
    if override and not missing_kueue(Path(override)):
        return KueueBinaries(dir=Path(override).resolve(), cached=True)
    directory = paths.kueue_cache_dir() / kueue_module_hash(paths.source_dir())
    if directory.is_dir() and not missing_kueue(directory):
        return KueueBinaries(dir=directory, cached=True)
    return None


def ensure_kueue(*, log: Log = print) -> KueueBinaries:
    """Return Kueue's controller and manifests, building them first when the cache has none.

    Same cache discipline as :func:`ensure_binaries` (temp dir renamed into place, a file
    lock per hash). Raises BuildError, gomod.GoModuleDownloadError or gomod.GoToolMissing.
    """
    found = find_kueue()
    if found:
        log(f"kueue: cache hit ({found.dir})")
        return found
    source = paths.source_dir()
    root = paths.kueue_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / kueue_module_hash(source)
    with open(root / f"{final.name}.lock", "w") as lock:
        if not _try_lock(lock):
            log(f"kueue: another process is building {final}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and not missing_kueue(final):
            log(f"kueue: cache hit ({final})")
            return KueueBinaries(dir=final, cached=True)
        started = time.monotonic()
        module_dir = source / "kueue"
        log(f"kueue: cache miss; building {KUEUE_MODULE} from {module_dir}/go.mod into {final} (after the "
            f"core binaries' cold build about 3 minutes on 2 cores: 187 s in a CI run from nothing, "
            f"docs/dev-cluster.md; with a warm Go build cache it only links)")
        gomod.download_modules(module_dir=module_dir)
        for stale in final.parent.glob(f".{final.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        tmp.mkdir(parents=True)
        try:
            info = json.loads(subprocess.run(
                [gomod.go_binary(), "list", "-m", "-json", KUEUE_MODULE], cwd=module_dir,
                capture_output=True, text=True, check=True).stdout)
            version, module_src = info["Version"], Path(info["Dir"])
            ldflags = " ".join(["-s", "-w", *kueue_ldflags(version=version)])
            compiled = 0
            for name, package in KUEUE_TARGETS.items():
                cmd = [gomod.go_binary(), "build", "-v", "-trimpath", f"-ldflags={ldflags}",
                       "-o", str(tmp / name), package]
                compiled += _run_with_progress(cmd=cmd, cwd=module_dir, log=log, started=started)
            _copy_config(module=KUEUE_MODULE, version=version, module_src=module_src,
                         files=KUEUE_CONFIG_FILES, out=tmp / KUEUE_CONFIG_DIR)
            missing = missing_kueue(tmp)
            if missing:
                raise BuildError(f"go build finished but did not produce {', '.join(missing)}")
            seconds = time.monotonic() - started
            (tmp / _MANIFEST).write_text(json.dumps({
                "module_hash": final.name, "kueue": version, "build_seconds": round(seconds, 1),
                "packages_compiled": compiled, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "targets": KUEUE_TARGETS}, indent=2))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"kueue: built in {_fmt(seconds)} ({compiled} packages compiled) -> {final}")
    return KueueBinaries(dir=final, cached=False, build_seconds=seconds, packages_compiled=compiled)


def kueue_ldflags(*, version: str) -> list[str]:
    """``-X`` linker flag stamping Kueue's version, as Kueue's Makefile does (``sigs.k8s.io/kueue/pkg/version``)."""
    return [f"-X {KUEUE_MODULE}/pkg/version.GitVersion={version}"]


def _copy_config(*, module: str, version: str, module_src: Path, files: dict[str, str], out: Path) -> None:
    """Copy ``files`` (destination -> path in the module: a directory's *.yaml files, or one file) from the
    module's source (Go's module cache, read-only) to ``out``, unchanged."""
    for dest, src in files.items():
        source, target = module_src / src, out / dest
        found = sorted(source.glob("*.yaml")) if source.is_dir() else [source]
        if not found or not all(f.is_file() for f in found):
            raise BuildError(f"{module} {version} has no {src} (needed for {out.name}/{dest})")
        folder = target if source.is_dir() else target.parent
        folder.mkdir(parents=True, exist_ok=True)
        for file in found:
            shutil.copyfile(file, folder / file.name if source.is_dir() else target)


def module_hash(source: Path) -> str:
    """sha256 (hex) of go.mod, go.sum and every file under ``cmd/`` of ``source``, and of
    go.mod, go.sum and the Go files of its ``lws/`` module.

    These are exactly the inputs of the build: the pinned versions and our wrapper mains.
    """
    digest = hashlib.sha256()
    files = [source / "go.mod", source / "go.sum"]
    files += sorted(p for p in (source / "cmd").rglob("*") if p.is_file())
    lws = source / "lws"
    files += [lws / "go.mod", lws / "go.sum", *sorted(lws.glob("*.go"))]
    for file in files:
        digest.update(str(file.relative_to(source)).encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def module_versions(go_mod_text: str) -> dict[str, str]:
    """``{module path: version}`` of every requirement line in a go.mod text (pure)."""
    versions: dict[str, str] = {}
    for match in re.finditer(r"^\s*(?:require\s+)?([\w./~-]+)\s+(v[\w.+-]+)", go_mod_text, re.M):
        versions.setdefault(match[1], match[2])
    return versions


def version_ldflags(go_mod_text: str) -> list[str]:
    """``-X`` linker flags so the binaries report their real versions (pure).

    Without them kube-apiserver reports "v0.0.0-master", and helm charts with a
    ``kubeVersion`` constraint refuse to install. Mirrors kubernetes' hack/lib/version.sh
    and helm's Makefile.
    """
    versions = module_versions(go_mod_text)
    flags: list[str] = []
    kube = versions.get("k8s.io/kubernetes")
    if kube:
        major, minor = kube.lstrip("v").split(".")[:2]
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [f"-X {pkg}.gitVersion={kube}", f"-X {pkg}.gitMajor={major}",
                      f"-X {pkg}.gitMinor={minor}", f"-X {pkg}.gitTreeState=clean"]
    helm = versions.get("helm.sh/helm/v3")
    if helm:
        flags.append(f"-X helm.sh/helm/v3/internal/version.version={helm}")
    client_go = versions.get("k8s.io/client-go")
    if client_go:
        minor = client_go.lstrip("v").split(".")[1]
        for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
            flags += [f"-X {pkg}.k8sVersionMajor=1", f"-X {pkg}.k8sVersionMinor={minor}"]
    return flags


def lws_ldflags(*, version: str) -> list[str]:
    """``-X`` linker flag stamping the LWS controller's version, as LWS's Makefile does
    (``sigs.k8s.io/lws/pkg/version``); without it ``--version`` says v0.0.0-main (pure)."""
    return [f"-X {LWS_MODULE}/pkg/version.GitVersion={version}"]


def missing_binaries(directory: Path) -> list[str]:
    """Names of TARGETS and LWS_TARGETS that are not executable files in ``directory``,
    plus ``lws-config`` when the LWS manifests are not there."""
    missing = [n for n in (*TARGETS, *LWS_TARGETS) if not os.access(directory / n, os.X_OK)]
    if not (directory / LWS_CONFIG_DIR / "webhook" / "manifests.yaml").is_file():
        missing.append(LWS_CONFIG_DIR)
    return missing


def find_binaries() -> Binaries | None:
    """The binaries without building: SGLANG_PD_CLUSTER_BIN_DIR, else a cache hit, else None.

    Raises BuildError when SGLANG_PD_CLUSTER_BIN_DIR is set but incomplete.
    """
    override = os.environ.get(paths.BIN_DIR_ENV)
    if override:
        directory = Path(override).resolve()
        missing = missing_binaries(directory)
        if missing:
            raise BuildError(f"{paths.BIN_DIR_ENV}={directory} lacks {', '.join(missing)}")
        return Binaries(dir=directory, cached=True)
    directory = paths.binary_cache_dir() / module_hash(paths.source_dir())
    if directory.is_dir() and not missing_binaries(directory):
        return Binaries(dir=directory, cached=True)
    return None


def ensure_binaries(*, log: Log = print) -> Binaries:
    """Return the binaries, building them first when the cache has none (see module doc).

    Prints progress through ``log``. Raises BuildError (build failed), or
    gomod.GoModuleDownloadError (the module proxy could not be reached; names the module)
    or gomod.GoToolMissing.
    """
    found = find_binaries()
    if found:
        log(f"binaries: cache hit ({found.dir})")
        return found
    source = paths.source_dir()
    key = module_hash(source)
    root = paths.binary_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        if not _try_lock(lock):
            log(f"binaries: another process is building {final}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and not missing_binaries(final):
            log(f"binaries: cache hit ({final})")
            return Binaries(dir=final, cached=True)
        seconds, compiled = _build(source=source, final=final, log=log)
    return Binaries(dir=final, cached=False, build_seconds=seconds, packages_compiled=compiled)


def _try_lock(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _build(*, source: Path, final: Path, log: Log) -> tuple[float, int]:
    """Download modules, run the one go build into a temp dir, rename it to ``final``.

    Returns (wall seconds, packages compiled)."""
    started = time.monotonic()
    lws_dir = source / "lws"
    log(f"binaries: cache miss; building {len(TARGETS) + len(LWS_TARGETS)} binaries from "
        f"{source}/go.mod and {lws_dir}/go.mod into {final}")
    log("binaries: checking Go modules (go mod download)")
    gomod.download_modules(module_dir=source)
    gomod.download_modules(module_dir=lws_dir)
    env_info = gomod.go_env(module_dir=source)
    log(f"binaries: {env_info.get('GOVERSION', 'go')}, GOCACHE={env_info.get('GOCACHE')} "
        f"(from an empty Go build cache this takes about 12 minutes on 2 cores, LWS included; with a "
        f"warm one it only links, well under a minute)")
    # We hold the lock of this hash: any temp dir of it is left over by a killed build.
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    try:
        ldflags = " ".join(["-s", "-w", *version_ldflags((source / "go.mod").read_text())])
        cmd = [gomod.go_binary(), "build", "-v", "-trimpath", f"-ldflags={ldflags}",
               "-o", str(tmp) + os.sep, *TARGETS.values()]
        compiled = _run_with_progress(cmd=cmd, cwd=source, log=log, started=started)
        compiled += _build_lws(module_dir=lws_dir, out=tmp, log=log, started=started)
        missing = missing_binaries(tmp)
        if missing:
            raise BuildError(f"go build finished but did not produce {', '.join(missing)}")
        seconds = time.monotonic() - started
        (tmp / _MANIFEST).write_text(json.dumps({
            "module_hash": final.name, "go": env_info.get("GOVERSION"),
            "build_seconds": round(seconds, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "targets": {**TARGETS, **LWS_TARGETS},
            "lws": module_versions((lws_dir / "go.mod").read_text()).get(LWS_MODULE),
        }, indent=2))
        if final.exists():  # a stale, incomplete directory from an older layout
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"binaries: built in {_fmt(seconds)} ({compiled} packages compiled) -> {final}")
    return seconds, compiled


def _build_lws(*, module_dir: Path, out: Path, log: Log, started: float) -> int:
    """Build LWS_TARGETS from the lws module into ``out`` and copy LWS_CONFIG_FILES from the
    module's source (in the Go module cache) to ``out/lws-config``. Returns packages compiled."""
    info = json.loads(subprocess.run(
        [gomod.go_binary(), "list", "-m", "-json", LWS_MODULE], cwd=module_dir,
        capture_output=True, text=True, check=True).stdout)
    version, module_src = info["Version"], Path(info["Dir"])
    log(f"binaries: building the LeaderWorkerSet controller {LWS_MODULE} {version}")
    ldflags = " ".join(["-s", "-w", *lws_ldflags(version=version)])
    compiled = 0
    for name, package in LWS_TARGETS.items():
        cmd = [gomod.go_binary(), "build", "-v", "-trimpath", f"-ldflags={ldflags}",
               "-o", str(out / name), package]
        compiled += _run_with_progress(cmd=cmd, cwd=module_dir, log=log, started=started)
    _copy_config(module=LWS_MODULE, version=version, module_src=module_src, files=LWS_CONFIG_FILES,
                 out=out / LWS_CONFIG_DIR)
    return compiled


def _run_with_progress(*, cmd: list[str], cwd: Path, log: Log, started: float) -> int:
    """Run go build -v, printing a progress line every PROGRESS_EVERY_S seconds.

    Returns the number of packages compiled (go -v names each one it compiles)."""
    parent = os.getpid()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1,
                            preexec_fn=lambda: procs.tie_to_parent(parent, signal.SIGTERM))
    compiled = 0
    last = ""
    tail: list[str] = []
    done = threading.Event()

    def ticker() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            log(f"binaries: still building... {compiled} packages compiled, "
                f"{_fmt(time.monotonic() - started)} elapsed (last: {last or '-'})")

    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line and " " not in line and not line.startswith("#"):
                compiled += 1
                last = line
            else:
                tail = (tail + [line])[-40:]
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
        thread.join()
    if code != 0:
        raise BuildError(f"go build failed (exit {code}) after {_fmt(time.monotonic() - started)}:\n"
                         + "\n".join(tail))
    return compiled


def _fmt(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"
