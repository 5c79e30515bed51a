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
_NAME_RE = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
#: A DNS-1123 subdomain (IsDNS1123Subdomain): the optional prefix of a key.
_SUBDOMAIN_RE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
NAME_MAX = 63
PREFIX_MAX = 253
VALUE_MAX = 63
KEY_MAX = PREFIX_MAX + 1 + NAME_MAX

#: The same rules as whole-string regexes, valid in Python's ``re`` and in RE2 (CEL's
#: ``matches`` in the API server): the CRD's rules (api/v1alpha1.py) are built from these.
KEY_SYNTAX_PATTERN = rf"^({_SUBDOMAIN_RE}/)?{_NAME_RE}$"
KEY_LENGTHS_PATTERN = rf"^([^/]{{1,{PREFIX_MAX}}}/)?[^/]{{1,{NAME_MAX}}}$"
VALUE_PATTERN = rf"^({_NAME_RE})?$"
KEY_RULE_TEXT = ("a Kubernetes label key: [prefix/]name, the name 1-63 letters, digits, '-', '_' or '.' "
                 "starting and ending with a letter or digit, the prefix a DNS subdomain of at most 253 characters "
                 "(e.g. nvidia.com/gpu.product)")

_NAME = re.compile(_NAME_RE)
_SUBDOMAIN = re.compile(_SUBDOMAIN_RE)


def cel_is_label_key(expr: str) -> str:
    """A CEL expression true when the string ``expr`` is a valid label key (the two patterns above)."""
    return f"{expr}.matches('{KEY_SYNTAX_PATTERN}') && {expr}.matches('{KEY_LENGTHS_PATTERN}')"


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
