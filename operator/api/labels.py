"""Kubernetes label syntax: keys and values of ``nodeSelector`` maps and toleration keys/values.

The API server refuses a Pod template whose nodeSelector key or value breaks these rules
(k8s.io/apimachinery/pkg/util/validation: ``IsQualifiedName`` for keys,
``IsValidLabelValue`` for values). A PDDeployment carries them into several Deployments;
refusing them here, when the spec is parsed, keeps a bad key from creating half a group
(one role's Deployment applied, the next refused). ``tests/e2e/test_label_syntax.py``
holds these functions to the real API server's verdict on the same keys and values.
"""

from __future__ import annotations

import re

#: A qualified name's name part, and a label value (non-empty form): alphanumerics at both ends,
#: '-', '_' and '.' inside (IsQualifiedName's qualifiedNameFmt / IsValidLabelValue's labelValueFmt).
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
#: A DNS-1123 subdomain (IsDNS1123Subdomain): the optional prefix of a key.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME_MAX = 63
PREFIX_MAX = 253
VALUE_MAX = 63


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (``[prefix/]name``), or None when it is.

    name: 1-63 characters, alphanumeric at both ends, ``-_.`` inside; prefix (optional): a
    DNS subdomain of at most 253 characters. Source: IsQualifiedName in
    k8s.io/apimachinery/pkg/util/validation/validation.go.
    """
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' is empty"
    if prefix:
        if "/" in prefix:
            return "a key has at most one '/' (prefix/name)"
        if len(prefix) > PREFIX_MAX:
            return f"the prefix is longer than {PREFIX_MAX} characters"
        if not _SUBDOMAIN.fullmatch(prefix):
            return "the prefix must be a DNS subdomain (lower-case letters, digits, '-' and '.', e.g. example.com)"
    if not name:
        return "the name part is empty"
    if len(name) > NAME_MAX:
        return f"the name part is longer than {NAME_MAX} characters"
    if not _NAME.fullmatch(name):
        return "the name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value, or None when it is (empty is valid).

    At most 63 characters, alphanumeric at both ends, ``-_.`` inside. Source:
    IsValidLabelValue in k8s.io/apimachinery/pkg/util/validation/validation.go.
    """
    if len(value) > VALUE_MAX:
        return f"longer than {VALUE_MAX} characters"
    if value and not _NAME.fullmatch(value):
        return "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit (or empty)"
    return None


def check_label_map(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` unchanged when every key and value is valid; raises ValueError naming the first bad one and why."""
    for key, value in labels.items():
        why = label_key_problem(key)
        if why is not None:
            raise ValueError(f"{key!r} is not a valid label key: {why}")
        why = label_value_problem(value)
        if why is not None:
            raise ValueError(f"the value {value!r} of {key!r} is not a valid label value: it {why}")
    return labels
