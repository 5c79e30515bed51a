"""kopf handlers: thin. Each one turns an event into "reconcile this PDDeployment" and returns.

- a PDDeployment event (added, modified) reconciles it;
- an event of a Deployment the operator owns reconciles its PDDeployment (status follows
  the children's readiness);
- a resync loop reconciles every PDDeployment every ``resync`` seconds (level-triggered:
  time-based rollout steps such as drain grace periods and progress deadlines, and
  recovery after API errors, do not depend on seeing an event).

Only event handlers are used, never create/update/timer handlers: those make kopf add
finalizers and bookkeeping annotations to the user's object, which a GitOps replace
would drop (Dynamo #13495). Nothing here writes to the user's object besides status.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from .api.v1alpha1 import GROUP, VERSION
from .reconcilers.runtime import Runtime
from .render.labels import LABEL_DEPLOYMENT, MANAGED_BY

log = logging.getLogger(__name__)

# Set by cli.run before kopf starts: the process-wide runtime and settings.
RUNTIME: Runtime | None = None
RESYNC_SECONDS: float = 15.0
NAMESPACES: list[str] | None = None


def _runtime() -> Runtime:
    if RUNTIME is None:  # pragma: no cover - cli.run always sets it
        raise RuntimeError("handlers.RUNTIME is not set; start the operator with `sglang-pd-operator run`")
    return RUNTIME


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """No kopf event posting (handlers log instead); start the resync loop."""
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    memo["resync"] = asyncio.get_running_loop().create_task(_resync_loop())


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the resync loop."""
    task = memo.get("resync")
    if task is not None:
        task.cancel()


async def _resync_loop() -> None:
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        rt = _runtime()
        try:
            keys = await asyncio.to_thread(rt.list_keys, NAMESPACES)
        except Exception as e:  # keep the loop alive across API hiccups
            log.warning("resync: cannot list PDDeployments: %s", e)
            continue
        for ns, name in keys:
            try:
                await asyncio.to_thread(rt.reconcile_key, ns, name)
            except Exception as e:
                log.exception("resync: reconcile %s/%s failed: %s", ns, name, e)


@kopf.on.event(GROUP, VERSION, "pddeployments")
def pddeployment_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    """Reconcile the PDDeployment that changed (deletion: owner references collect the children)."""
    if event.get("type") == "DELETED":
        return
    _runtime().reconcile_key(namespace, name)


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": MANAGED_BY})
def child_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    """A child Deployment changed: reconcile its PDDeployment so status follows readiness."""
    owner = labels.get(LABEL_DEPLOYMENT)
    if owner:
        _runtime().reconcile_key(namespace, owner)
