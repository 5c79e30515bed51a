"""The runtime image against the SGLang version the spec declares.

``spec.runtime.sglangVersion`` is what the operator's rules, the compat key and the
rendered flags assume; the image is what runs. Nothing inside the cluster can read the
version out of an image before a pod starts, so the one evidence available offline is
the image tag SGLang's own images carry (``lmsysorg/sglang:v0.5.23-cu130``).
"""

from __future__ import annotations

import re

from ...api.v1alpha1 import PDDeploymentSpec
from ..structs import RolePlan
from ..problems import Problem

#: A SGLang version in an image tag: ``v0.5.23``, ``0.5.23.post1``, followed by a
#: separator (``-cu130``) or the end; not a part of a longer dotted number.
#: The oldest SGLang the operator's rules cover (spec.runtime.sglangVersion's pattern).
FIRST_SUPPORTED = "0.5.23"
_TAG_VERSION = re.compile(r"(?<![0-9.])v?([0-9]+\.[0-9]+\.[0-9]+(?:\.post[0-9]+)?)(?![0-9.])")


def image_tag_version(image: str) -> str | None:
    """The SGLang version an image reference's tag names, or None when it names none.

    ``lmsysorg/sglang:v0.5.23-cu130`` -> ``0.5.23``; a registry port
    (``registry:5000/sglang``), a digest-only reference (``...@sha256:...``) or a tag
    without a version (``latest``, ``dev``) -> None. The tag is what follows the last
    ``:`` after the last ``/`` (the OCI reference grammar), up to an ``@digest``.
    """
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    found = _TAG_VERSION.search(last.split(":", 1)[1])
    return found.group(1) if found else None


def image_tag_matches_version(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Warn when the image tag names another SGLang version than ``runtime.sglangVersion``.

    Source: the operator's rules are those of sglang 0.5.23 (../shared/reference/
    sglang-0.5.23.md) and are chosen by ``sglangVersion``; SGLang's images are tagged
    ``v<version>-<platform>`` (``lmsysorg/sglang:v0.5.23-cu130``). An image of another
    version would be judged by the wrong rules, and the compat key would not change when
    only the image moves to a version whose handshake differs (sglang #45075: prefill and
    decode upgrade together). A warning, not a refusal: a site may retag images.
    """
    tagged = image_tag_version(spec.runtime.image)
    if tagged is None or tagged == spec.runtime.sglangVersion:
        return []
    wanted = spec.runtime.sglangVersion
    if _release(tagged) >= _release(FIRST_SUPPORTED):
        fix = f"set sglangVersion to the image's version ({tagged}) or use an image of SGLang {wanted}"
    else:
        fix = f"use an image of SGLang {wanted} (SGLang {tagged} is older than {FIRST_SUPPORTED}, the first supported)"
    return [Problem(
        field="spec.runtime.sglangVersion",
        message=(f"runtime.image {spec.runtime.image!r} is tagged for SGLang {tagged}, but sglangVersion says "
                 f"{spec.runtime.sglangVersion}: the operator checks and renders for {spec.runtime.sglangVersion}"),
        fix=fix,
        rule="image_tag_matches_version",
        severity="warning",
    )]


def _release(version: str) -> tuple[int, ...]:
    """``0.5.23.post1`` -> (0, 5, 23, 1): the numbers, for ordering versions."""
    return tuple(int(n) for n in re.findall(r"[0-9]+", version))
