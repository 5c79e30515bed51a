"""Turn a failed API call of a reconcile into a condition's reason and message.

A reconcile makes many calls (apply each rendered object, list children, delete a
drained group). When one fails, status must say which call failed and what the API
server answered, not only the operator's log: :class:`CallTracker` wraps the
reconcile's :class:`~sglang_pd_operator.reconcilers.kube.Kube` and remembers the last
call it started, and :func:`describe_api_error` turns the exception into (reason,
message) for the ``Reconciled`` condition (reconcilers/status.py). Nothing here writes.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from .kube import Kube

#: Markers of an admission refusal in a 403's message (ValidatingAdmissionPolicy, webhooks).
_ADMISSION_MARKERS = ("admission webhook", "ValidatingAdmissionPolicy", "denied request", "denied the request")


class CallTracker:
    """A :class:`Kube` that remembers the call in flight (``last``), for error messages.

    Delegates every attribute to the wrapped client; ``get``, ``list``, ``apply``,
    ``delete`` and ``patch_status`` first record e.g. ``apply Deployment ns/name``.
    """

    def __init__(self, kube: Kube):
        self._kube = kube
        self.last = "read the cluster"
        #: (Valid condition, status.sglang record) of the generation being reconciled, once decided
        #: (pddeployment._reconcile); a failed call's record writes them too
        self.decided: tuple[Any, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None, **kw: Any) -> Any:
        self.last = f"get {kind} {_where(namespace, name)}"
        return self._kube.get(api_version, kind, name, namespace, **kw)

    def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str, **kw: Any) -> Any:
        self.last = f"list {kind} in {namespace or 'all namespaces'}"
        return self._kube.list(api_version, kind, namespace, label_selector, **kw)

    def apply(self, desired: dict[str, Any], *args: Any, **kw: Any) -> Any:
        meta = desired.get("metadata") or {}
        verb = "dry-run apply" if kw.get("dry_run") or getattr(self._kube, "dry_run", False) else "apply"
        self.last = f"{verb} {desired.get('kind')} {_where(meta.get('namespace'), meta.get('name'))}"
        return self._kube.apply(desired, *args, **kw)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None, **kw: Any) -> Any:
        self.last = f"delete {kind} {_where(namespace, name)}"
        return self._kube.delete(api_version, kind, name, namespace, **kw)

    def patch_status(self, api_version: str, kind: str, name: str, namespace: str, status: dict, **kw: Any) -> Any:
        self.last = f"write the status of {kind} {_where(namespace, name)}"
        return self._kube.patch_status(api_version, kind, name, namespace, status, **kw)


def _where(namespace: str | None, name: str | None) -> str:
    return f"{namespace}/{name}" if namespace else str(name)


def server_message(e: ApiException) -> str:
    """The API server's own message (the Status body's ``message``), else the HTTP reason."""
    body = getattr(e, "body", None)
    if body:
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and doc.get("message"):
                return str(doc["message"])
        except (TypeError, ValueError):
            text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
            return text.strip()[:500]
    return f"{e.status} {e.reason}".strip()


def error_reason(e: ApiException) -> str:
    """CamelCase class of an API error, for a condition's reason.

    A refusal by admission (a ValidatingAdmissionPolicy answers 422 unless its
    validation sets a reason, a webhook usually 400 or 403): AdmissionDenied; other
    403: Forbidden (RBAC); 422: Invalid (a field the API server rejects); 409:
    Conflict; 404: NotFound; 429: TooManyRequests; 5xx: ServerError; else APIError.
    """
    if (e.status or 0) < 500 and any(m in server_message(e) for m in _ADMISSION_MARKERS):
        return "AdmissionDenied"
    return {403: "Forbidden", 422: "Invalid", 409: "Conflict", 404: "NotFound", 429: "TooManyRequests"}.get(
        e.status or 0, "ServerError" if (e.status or 0) >= 500 else "APIError"
    )


def describe_api_error(e: ApiException, *, call: str) -> tuple[str, str]:
    """(reason, message) for a failed ``call`` (e.g. ``apply Deployment ns/x-prefill``).

    The message names the call, the HTTP status and the server's answer, e.g.
    ``apply Deployment ns/x: 403 Forbidden: deployments.apps "x" is forbidden:
    ValidatingAdmissionPolicy 'p' with binding 'b' denied request: ...``.
    """
    return error_reason(e), f"{call}: {e.status} {e.reason}: {server_message(e)}"


def namespace_terminating(e: ApiException) -> bool:
    """The API server refused a create because the namespace is being deleted.

    Its Status carries ``details.causes[].reason == "NamespaceTerminating"`` (403, from the
    NamespaceLifecycle admission plugin); the namespace's deletion removes what the operator
    owns there, so such a refusal is expected and no RBAC problem.
    """
    if e.status != 403 or not getattr(e, "body", None):
        return False
    try:
        doc = json.loads(e.body)
    except (TypeError, ValueError):
        return False
    causes = ((doc.get("details") or {}).get("causes") or []) if isinstance(doc, dict) else []
    return any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes)


def brief(e: ApiException) -> str:
    """One line for a log: ``<status> <reason>: <the server's message>``.

    ``str()`` of the dynamic client's errors (``kubernetes.dynamic.exceptions``) spans
    many lines: the response headers, the body and the original traceback.
    """
    return f"{e.status} {error_reason(e)}: {server_message(e)}"
