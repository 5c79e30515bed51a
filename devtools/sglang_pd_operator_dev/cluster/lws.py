"""The LeaderWorkerSet controller of the dev cluster: its objects and command line (pure).

The real controller (sigs.k8s.io/lws, built by ``build`` as ``lws-controller``) runs as a
local process outside the cluster, with a kubeconfig, like the other components. What it
needs in the API server comes from the LWS module's own manifests, which ``build`` copies
unchanged into ``<bin_dir>/lws-config/``:

- its CRDs (``config/crd/bases``: LeaderWorkerSet and DisaggregatedSet, one version each,
  so the conversion webhook the module's kustomize patch would add is never called and is
  left out);
- its ClusterRole (``config/rbac/role.yaml``), bound to the controller's client
  certificate user (``pki.CLIENTS["lws-controller"]``);
- its webhook configurations (``config/webhook``, with the module's kustomize patches
  applied), changed in two ways only: the ``lws-`` name prefix of the module's
  ``config/default``, and ``clientConfig`` pointing at the controller's webhook server on
  ``https://127.0.0.1:<port><path>`` with the harness CA as ``caBundle`` instead of an
  in-cluster Service (there is no Service network here).

The controller's own certificate management is off (``internalCertManagement.enable:
false``: it would write a Secret and patch the webhook configurations with a CA of its
own); its webhook server reads the serving certificate the harness CA signed
(``pki.WEBHOOK_SERVERS["lws"]``) from its CertDir.

Scoping, checked by :func:`check_scoped` before anything is applied: a webhook that
matches pods must select only LWS pods (an objectSelector on ``leaderworkerset.sigs.k8s.io/name``,
as the module's patch sets), every other webhook may only match LWS's own API groups. The
module's ``failurePolicy: Fail`` is kept: an LWS pod admitted without the mutating webhook
would lack LWS_WORKER_INDEX / LWS_LEADER_ADDRESS and the worker-index label (a worker would
start as the wrong rank, and the pod controller refuses pods without the label), so with
the controller stopped LWS pods and LWS objects are refused, and nothing else is.

Nothing here starts a process or calls the API; ``cluster`` does.
"""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import urlsplit

import jsonpatch
import yaml

#: The controller's configuration API (sigs.k8s.io/lws api/config/v1alpha1).
CONFIG_API_VERSION = "config.lws.x-k8s.io/v1alpha1"
#: Name prefix of LWS's cluster-scoped objects (namePrefix of the module's config/default).
NAME_PREFIX = "lws-"
#: Pod label LWS sets on every pod of a group (the pod webhooks' objectSelector key).
SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
#: API groups LWS serves; webhooks that do not match pods may only match these.
LWS_GROUPS = frozenset({"leaderworkerset.x-k8s.io", "disaggregatedset.x-k8s.io"})
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class LwsConfigError(ValueError):
    """The LWS module's manifests are not what the harness can install safely."""


def controller_config(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    """The controller's ``--config`` file (a ``Configuration``), as a dict.

    Webhook server and health probes on 127.0.0.1 (``health_port`` answers /readyz),
    metrics off, no leader election (one replica), internal cert management off (see the
    module docstring). Field names: sigs.k8s.io/lws api/config/v1alpha1
    configuration_types.go; the controller decodes the file strictly.
    """
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


def controller_argv(*, binary: Path, kubeconfig: Path, config_file: Path) -> list[str]:
    """Command line of the controller (flags: sigs.k8s.io/lws cmd/main.go)."""
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config_file}",
            "--leader-elect=false", "--zap-devel=false", "--zap-encoder=console"]


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crds(config_dir: Path) -> list[dict]:
    """The module's CustomResourceDefinitions (``crd/*.yaml``), unchanged.

    Raises LwsConfigError when there are none or one is not a CRD.
    """
    found = [doc for f in sorted((config_dir / "crd").glob("*.yaml")) for doc in _docs(f)]
    if not found or any(d.get("kind") != "CustomResourceDefinition" for d in found):
        raise LwsConfigError(f"{config_dir / 'crd'}: expected the LWS module's CRDs")
    return found


def rbac(config_dir: Path, *, user: str) -> list[dict]:
    """The module's ClusterRole (renamed with NAME_PREFIX) and a binding of it to ``user``."""
    (role,) = [d for d in _docs(config_dir / "rbac" / "role.yaml") if d.get("kind") == "ClusterRole"]
    name = NAME_PREFIX + role["metadata"]["name"]
    role = {**role, "metadata": {**role["metadata"], "name": name}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{name}binding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    return [role, binding]


def _kustomized_webhooks(webhook_dir: Path) -> list[dict]:
    """The webhook configurations of ``webhook/kustomization.yaml``'s resources with its
    JSON6902 ``patches`` (each names a target kind and name) applied."""
    kustomization = yaml.safe_load((webhook_dir / "kustomization.yaml").read_text())
    configs = [d for r in kustomization.get("resources", []) for d in _docs(webhook_dir / r)
               if d.get("kind") in WEBHOOK_KINDS]
    for patch in kustomization.get("patches", []):
        target = patch.get("target") or {}
        matches = [c for c in configs if c["kind"] == target.get("kind")
                   and c["metadata"]["name"] == target.get("name")]
        if len(matches) != 1:
            raise LwsConfigError(f"{webhook_dir}: patch {patch.get('path')} targets {target}, "
                                 f"found {len(matches)} webhook configurations")
        ops = yaml.safe_load((webhook_dir / patch["path"]).read_text())
        configs[configs.index(matches[0])] = jsonpatch.apply_patch(matches[0], ops)
    if not configs:
        raise LwsConfigError(f"{webhook_dir}: no webhook configurations")
    return configs


def _matches_pods(webhook: dict) -> bool:
    return any("" in r.get("apiGroups", []) and {"pods", "*"} & set(r.get("resources", []))
               for r in webhook.get("rules", []))


def _selects_lws_pods_only(webhook: dict) -> bool:
    selector = webhook.get("objectSelector") or {}
    if SET_NAME_LABEL in (selector.get("matchLabels") or {}):
        return True
    return any(e.get("key") == SET_NAME_LABEL and e.get("operator") in ("Exists", "In")
               for e in selector.get("matchExpressions") or [])


def check_scoped(configs: list[dict]) -> None:
    """Raise LwsConfigError unless every webhook admits only LWS's own objects: pod
    webhooks select LWS pods by SET_NAME_LABEL, the others match only LWS_GROUPS.

    So a stopped controller blocks nothing but LWS objects (see the module docstring).
    """
    for config in configs:
        for webhook in config.get("webhooks", []):
            where = f"{config['kind']} {config['metadata']['name']} webhook {webhook.get('name')}"
            if _matches_pods(webhook):
                if not _selects_lws_pods_only(webhook):
                    raise LwsConfigError(f"{where} matches pods without an objectSelector on "
                                         f"{SET_NAME_LABEL}: it would gate every pod")
                continue
            groups = {g for r in webhook.get("rules", []) for g in r.get("apiGroups", [])}
            if not groups or groups - LWS_GROUPS:
                raise LwsConfigError(f"{where} matches API groups {sorted(groups - LWS_GROUPS) or ['*']} "
                                     f"outside LWS's own {sorted(LWS_GROUPS)}")


def webhook_configurations(config_dir: Path, *, port: int, ca_cert: bytes) -> list[dict]:
    """The module's webhook configurations, served by the local controller.

    ``port``: the controller's webhook port on 127.0.0.1; ``ca_cert``: PEM of the CA that
    signed its serving certificate. Each webhook's ``clientConfig.service.path`` becomes
    ``url: https://127.0.0.1:<port><path>`` with ``caBundle``; names get NAME_PREFIX;
    everything else (rules, selectors, failurePolicy, sideEffects) is the module's.
    Raises LwsConfigError when a webhook has no service path or is not scoped (check_scoped).
    """
    bundle = base64.b64encode(ca_cert).decode()
    result = []
    for config in _kustomized_webhooks(config_dir / "webhook"):
        webhooks = []
        for webhook in config.get("webhooks", []):
            path = ((webhook.get("clientConfig") or {}).get("service") or {}).get("path")
            if not path:
                raise LwsConfigError(f"webhook {webhook.get('name')} has no clientConfig.service.path")
            webhooks.append({**webhook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                                         "caBundle": bundle}})
        result.append({**config, "metadata": {"name": NAME_PREFIX + config["metadata"]["name"]},
                       "webhooks": webhooks})
    check_scoped(result)
    return result


def webhook_paths(configs: list[dict]) -> list[str]:
    """The URL paths the configurations call (to wait until the server serves each)."""
    return sorted({urlsplit(w["clientConfig"]["url"]).path for c in configs for w in c["webhooks"]})
