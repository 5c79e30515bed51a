"""Fetch the Go modules of ``hack/cluster`` and explain failures in plain words.

``build`` calls :func:`download_modules` before ``go build`` so that a missing network
shows up as "the Go module proxy could not be reached while downloading <module>",
rather than as a wall of compiler output. Parsing is pure (:func:`parse_failures`,
:func:`describe_failures`) and tested without a network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Words in go's error text that mean "the proxy (or the network to it) did not answer".
_UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|network is unreachable|no route to host"
    r"|TLS handshake timeout|connection reset|context deadline exceeded|proxyconnect"
    r"|server misbehaving|Client\.Timeout|EOF$|dial tcp",
    re.IGNORECASE,
)
# "go: cel.dev/expr@v0.25.2: Get "http://...": dial tcp ...: connection refused"
_STDERR_LINE = re.compile(r"^go: (?P<module>[^\s@:]+@[^\s:]+): (?P<reason>.+)$")


class GoToolMissing(RuntimeError):
    """``go`` is not on PATH."""


@dataclass(frozen=True)
class ModuleFailure:
    """One module go could not download: ``module`` is "path@version"."""

    module: str
    reason: str

    @property
    def unreachable(self) -> bool:
        """True when the reason says the proxy or network did not answer."""
        return bool(_UNREACHABLE.search(self.reason))

    @property
    def proxy_disabled(self) -> bool:
        """True when GOPROXY=off forbade the download."""
        return "GOPROXY=off" in self.reason


class GoModuleDownloadError(RuntimeError):
    """``go mod download`` failed; ``failures`` lists the modules, ``str()`` explains."""

    def __init__(self, *, failures: list[ModuleFailure], proxy: str, raw: str) -> None:
        self.failures = failures
        self.proxy = proxy
        self.raw = raw
        super().__init__(describe_failures(failures=failures, proxy=proxy, raw=raw))


def go_binary() -> str:
    """Path of ``go``; raises GoToolMissing with what to do instead."""
    found = shutil.which("go")
    if not found:
        raise GoToolMissing(
            "`go` was not found on PATH: building the dev cluster needs Go >= 1.26 "
            "(or set SGLANG_PD_CLUSTER_BIN_DIR to a directory of prebuilt binaries)"
        )
    return found


def go_env(*, module_dir: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``go env -json`` for the variables the build reports (GOPROXY, GOMODCACHE, ...)."""
    out = subprocess.run(
        [go_binary(), "env", "-json", "GOPROXY", "GOMODCACHE", "GOCACHE", "GOFLAGS", "GOVERSION"],
        cwd=module_dir, env=dict(env) if env is not None else None,
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def parse_failures(*, stdout: str, stderr: str) -> list[ModuleFailure]:
    """Modules that ``go mod download -json`` could not fetch, in the order go printed.

    Two places carry them: the JSON objects' ``Error`` field (a module whose zip failed)
    and ``go: <module>@<version>: <reason>`` lines on stderr (loading the module graph
    failed before any JSON was written). Duplicates are dropped.
    """
    failures: list[ModuleFailure] = []
    seen: set[str] = set()

    def add(module: str, reason: str) -> None:
        if module not in seen:
            seen.add(module)
            failures.append(ModuleFailure(module=module, reason=reason.strip()))

    decoder = json.JSONDecoder()
    text, pos = stdout.strip(), 0
    while pos < len(text):
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if isinstance(obj, dict) and obj.get("Error"):
            module = f"{obj.get('Path', '?')}@{obj.get('Version', '?')}"
            reason = str(obj["Error"])
            if reason.startswith(module + ": "):
                reason = reason[len(module) + 2:]
            add(module, reason)
    for line in stderr.splitlines():
        match = _STDERR_LINE.match(line.strip())
        if match:
            add(match["module"], match["reason"])
    return failures


def describe_failures(*, failures: list[ModuleFailure], proxy: str, raw: str = "") -> str:
    """One readable paragraph: which module failed, why, and what to do.

    ``proxy`` is the GOPROXY value in effect (e.g. "https://proxy.golang.org,direct").
    """
    if not failures:
        tail = "\n".join(raw.strip().splitlines()[-15:])
        return f"go mod download failed (GOPROXY={proxy}):\n{tail}"
    first = failures[0]
    more = f" ({len(failures) - 1} more modules failed too)" if len(failures) > 1 else ""
    if first.proxy_disabled:
        head = (f"cannot download Go module {first.module}: GOPROXY=off forbids downloads "
                f"and the module is not in the module cache")
    elif first.unreachable:
        head = (f"the Go module proxy could not be reached (GOPROXY={proxy}) while "
                f"downloading Go module {first.module}: {first.reason}")
    else:
        head = f"cannot download Go module {first.module} via GOPROXY={proxy}: {first.reason}"
    hint = ("The dev cluster is built from Go modules fetched through the module proxy "
            "(default https://proxy.golang.org). Check network access to it, point GOPROXY "
            "at a reachable mirror, fill GOMODCACHE from a machine that has them, or set "
            "SGLANG_PD_CLUSTER_BIN_DIR to a directory of prebuilt binaries.")
    return f"{head}{more}.\n{hint}"


def download_modules(*, module_dir: Path, env: Mapping[str, str] | None = None) -> None:
    """Run ``go mod download -json`` in ``module_dir``; quick when the cache is warm.

    Raises GoModuleDownloadError (naming the first failing module and the proxy) on
    failure, GoToolMissing when go is absent.
    """
    run_env = dict(os.environ if env is None else env)
    proc = subprocess.run(
        [go_binary(), "mod", "download", "-json"],
        cwd=module_dir, env=run_env, capture_output=True, text=True,
    )
    if proc.returncode == 0:
        return
    try:
        proxy = go_env(module_dir=module_dir, env=run_env).get("GOPROXY", "")
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        proxy = run_env.get("GOPROXY", "https://proxy.golang.org,direct")
    raise GoModuleDownloadError(
        failures=parse_failures(stdout=proc.stdout, stderr=proc.stderr),
        proxy=proxy, raw=proc.stdout + proc.stderr,
    )
