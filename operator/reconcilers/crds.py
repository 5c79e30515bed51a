"""The operator's own CRDs at start: optionally apply them, and refuse to run on an older schema.

Helm never upgrades the CRDs in a chart's ``crds/`` folder, and a GitOps tool may sync
the operator's Deployment before its CRDs. An operator that runs against an older CRD
than the one it was built with loses data silently: the API server prunes the fields the
stored schema does not declare, so a new status field or a new spec knob vanishes on
every write. So at start (``sglang-pd-operator run --crds``):

- ``check`` (default): read each CRD this package generates (``api.crd.all_crds``) from
  the API server and compare its schema with ours. Missing, or lacking a served version,
  a field or an enum value we declare: refuse to start, naming what is missing and how to
  upgrade. An installed CRD that declares *more* than ours (a newer chart, a rollback of
  the operator) is accepted with a warning.
- ``apply``: the same comparison, but a missing or older CRD is server-side applied
  (field manager ``sglang-pd-operator``) first; an equal or newer one is left alone
  (zero writes), then checked as above.
- ``skip``: no CRD access at all (needs no RBAC on customresourcedefinitions).

:func:`missing_in` is pure and unit-tested; :func:`ensure_crds` is the only function
here that talks to the API (through :class:`~.kube.Kube`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import urllib3

from ..api.crd import all_crds
from .kube import Kube

log = logging.getLogger(__name__)

CRD_API_VERSION = "apiextensions.k8s.io/v1"
POLICIES = ("check", "apply", "skip")


class CRDSchemaError(RuntimeError):
    """The installed CRDs cannot serve this operator; the message says what is missing and the fix."""


class CRDCheckUnreachable(RuntimeError):
    """The API server did not answer the CRD check at start (connect or read timeout, refused).

    The process exits (code 1) and its pod restarts, as controller-runtime's manager does
    when it cannot reach the API server at start; the message names the server and the cause.
    """


def _walk(schema: dict[str, Any], path: str) -> Iterator[str]:
    """Every field path of a structural schema, plus ``path=value`` for each enum value."""
    yield path
    for value in schema.get("enum") or []:
        yield f"{path}={value}"
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def _parent(path: str) -> str:
    """The path one level up: ``.a.b`` -> ``.a``, ``.a[]`` -> ``.a``, ``.a=x`` -> ``.a`` (field names hold no ``=``)."""
    if "=" in path:
        return path[: path.index("=")]
    if path.endswith(("[]", "{}")):
        return path[:-2]
    return path[: path.rindex(".")] if "." in path else ""


def schema_facts(crd: dict[str, Any]) -> dict[str, set[str]]:
    """Served version name -> the set of field paths and enum values its schema declares."""
    out: dict[str, set[str]] = {}
    for version in crd.get("spec", {}).get("versions") or []:
        if not version.get("served"):
            continue
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        out[version["name"]] = set(_walk(schema, ""))
    return out


def missing_in(*, installed: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What ``expected`` declares that ``installed`` lacks: served versions, fields, enum values.

    Paths are written like ``v1alpha1: spec.kvLayout.layout=v41_new`` (an enum value) or
    ``v1alpha1: status.rollout`` (a field). Empty when ``installed`` is the same schema or a
    newer one (a superset). Pure.
    """
    have, want = schema_facts(installed), schema_facts(expected)
    problems: list[str] = []
    for version, paths in want.items():
        if version not in have:
            problems.append(f"version {version} is not served")
            continue
        missing = paths - have[version]
        # a missing subtree is reported once, by its root
        roots = sorted(p for p in missing if _parent(p) not in missing)
        problems += [f"{version}: {p.lstrip('.')}" for p in roots]
    return problems


def extra_in(*, installed: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What ``installed`` declares beyond ``expected`` (a newer CRD than this operator's). Pure."""
    return missing_in(installed=expected, expected=installed)


def _fix(verb: str) -> str:
    helm = "install" if verb == "install" else "upgrade"
    return (f"{verb} the CRD: `helm {helm}` the sglang-pd-operator chart (crds.install=true), or "
            f"`kubectl apply --server-side -f crds/` from this operator's release, or run the operator with "
            f"--crds=apply (chart value operator.crds=apply grants it the needed RBAC)")


def ensure_crds(*, kube: Kube, policy: str, expected: dict[str, dict[str, Any]] | None = None,
                established_timeout_s: float = 30.0) -> None:
    """Apply (policy ``apply``) and check (``check``/``apply``) the operator's CRDs; ``skip`` does nothing.

    Raises :class:`CRDSchemaError` when a CRD is missing or older than ``expected``
    (default: the CRDs generated from this package's API models), :class:`CRDCheckUnreachable`
    when the API server does not answer the check.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown CRD policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == "skip":
        log.info("CRD check skipped (--crds=skip)")
        return
    crds = expected if expected is not None else all_crds()
    for crd in crds.values():
        name = crd["metadata"]["name"]
        try:
            installed = kube.get(CRD_API_VERSION, "CustomResourceDefinition", name)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            cause = getattr(e, "reason", None) or e
            raise CRDCheckUnreachable(f"the API server did not answer the CRD check of {name}: {cause}; "
                                      "check the kubeconfig / in-cluster address and the network path") from e
        if policy == "apply" and (installed is None or missing_in(installed=installed, expected=crd)):
            log.info("CRD %s is %s: applying this operator's version (server-side)", name,
                     "missing" if installed is None else "older than this operator")
            kube.apply(crd, fetch=False)
            installed = _wait_established(kube, name, established_timeout_s)
        if installed is None:
            raise CRDSchemaError(f"CRD {name} is not installed; {_fix('install')}")
        missing = missing_in(installed=installed, expected=crd)
        if missing:
            shown = "; ".join(missing[:12]) + (f"; and {len(missing) - 12} more" if len(missing) > 12 else "")
            raise CRDSchemaError(
                f"the installed CRD {name} is older than this operator: it lacks {shown}. Running on it would "
                f"silently drop these fields on every write, so the operator refuses to start; {_fix('upgrade')}")
        extra = extra_in(installed=installed, expected=crd)
        if extra:
            log.warning("the installed CRD %s is newer than this operator (it also declares %s); objects that "
                        "set those fields will be reported invalid until the operator is upgraded",
                        name, "; ".join(extra[:6]))
        else:
            log.info("CRD %s matches this operator's schema", name)


def _wait_established(kube: Kube, name: str, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    crd = kube.get(CRD_API_VERSION, "CustomResourceDefinition", name)
    while time.monotonic() < deadline:
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return crd
        time.sleep(0.5)
        crd = kube.get(CRD_API_VERSION, "CustomResourceDefinition", name)
    return crd
