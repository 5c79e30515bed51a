"""Kueue in the dev cluster (optional, like LWS): its objects and command line (pure).

The real Kueue controller manager (sigs.k8s.io/kueue ``cmd/kueue``, built by ``build`` as
``kueue-controller`` into its own cache directory) runs as a local process with a
kubeconfig, like the LWS controller (``lws``). What it needs in the API server comes from
Kueue's own manifests, which ``build`` copies unchanged beside the binary
(``kueue-config/``): its CRDs with the module's conversion-webhook patches, its manager
ClusterRole, and its webhook configurations.

Differences from Kueue's release manifests, and why:

- No Deployment, Service or cert-manager: the controller is a local process; its webhook
  server listens on 127.0.0.1 with a serving certificate of the harness CA (``pki``), and
  every webhook (and the CRDs' conversion webhook) calls ``https://127.0.0.1:<port><path>``
  with that CA as ``caBundle``. Internal cert management is off.
- Integrations: only ``leaderworkerset.x-k8s.io/leaderworkerset`` (which turns on ``pod``
  implicitly, pkg/controller/jobs/leaderworkerset). Only the webhooks of Kueue's own API
  group, of LeaderWorkerSets and of pods are registered, and the pod webhooks select LWS
  pods only (``objectSelector`` on ``leaderworkerset.sigs.k8s.io/name``): a stopped Kueue
  then blocks nothing but LWS objects and pods, and Kueue objects (:func:`check_scoped`).
- ``VisibilityOnDemand`` off (an aggregated API server the dev cluster does not route to),
  metrics off, no leader election (one replica). Topology-aware scheduling is on (Kueue's
  default since v0.14).
- Kueue v0.17.0 with internal cert management off insists on a metrics certificate at the
  fixed path /etc/kueue/metrics/certs (even with metrics off). The controller runs in its own
  mount namespace whose /etc is an overlay adding that folder from the run directory
  (:func:`controller_argv`); the machine's /etc is not touched.

:func:`queue_objects` makes the Topology, ResourceFlavor, ClusterQueue and LocalQueue the
e2e tests and the docs use: levels = the NVLink clique label and the node name.
"""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import urlsplit

import yaml

#: Kueue's configuration API (sigs.k8s.io/kueue apis/config/v1beta2).
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
API_VERSION = "kueue.x-k8s.io/v1beta2"
GROUP = "kueue.x-k8s.io"
#: Name prefix of Kueue's cluster-scoped objects (namePrefix of the module's config/default).
NAME_PREFIX = "kueue-"
#: Kueue's own namespace (its Configuration's ``namespace``; its webhooks skip it).
NAMESPACE = "kueue-system"
#: The only integration enabled (pod comes with it).
FRAMEWORKS = ("leaderworkerset.x-k8s.io/leaderworkerset",)
#: API groups whose webhooks are registered: Kueue's own and LeaderWorkerSet's (pods: see LWS_POD_LABEL).
WEBHOOK_GROUPS = frozenset({GROUP, "leaderworkerset.x-k8s.io"})
#: Pod label LWS sets on every pod of a group: the pod webhooks' objectSelector key.
LWS_POD_LABEL = "leaderworkerset.sigs.k8s.io/name"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
#: Feature gates set on the command line (see the module docstring).
FEATURE_GATES = "VisibilityOnDemand=false"
#: Node label keys, top down, of the dev cluster's Topology: the NVLink clique (rack), then the node.
CLIQUE_LABEL = "nvidia.com/gpu.clique"
HOSTNAME_LABEL = "kubernetes.io/hostname"


class KueueConfigError(ValueError):
    """Kueue's manifests are not what the harness can install safely."""


def controller_config(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    """The controller's ``--config`` file (a Kueue ``Configuration``), as a dict.

    Field names: sigs.k8s.io/kueue apis/config/v1beta2 configuration_types.go.
    """
    return {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


#: Where Kueue v0.17.0 reads its metrics serving certificate when internal cert management is off: a fixed
#: path (cmd/kueue/main.go, "Initializing metrics certificate watcher"), read at start even with metrics off.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
#: Mounts an overlay on /etc (lower: the machine's /etc, upper: $1, work: $2) in the process's own mount
#: namespace, then execs the rest of the command line: the same pid, nothing changed outside the process.
_OVERLAY_ETC = 'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'


def etc_overlay_dirs(run_kueue_dir: Path) -> tuple[Path, Path]:
    """(upper, work) directories of the controller's /etc overlay under the run's ``kueue/`` folder; the
    harness puts a certificate and key at ``upper/kueue/metrics/certs/tls.crt|tls.key``."""
    return run_kueue_dir / "etc-upper", run_kueue_dir / "etc-work"


def controller_argv(*, binary: Path, kubeconfig: Path, config_file: Path, etc_upper: Path, etc_work: Path,
                    as_root: bool) -> list[str]:
    """Command line of the controller (flags: sigs.k8s.io/kueue cmd/kueue/main.go, controller-runtime's
    ``--kubeconfig``, zap's flags), run in a private mount namespace (``unshare``, util-linux) whose /etc is
    an overlay adding METRICS_CERT_DIR from ``etc_upper``: Kueue refuses to start without a certificate
    there, and the harness writes nothing outside the run directory. ``as_root``: the harness runs as
    root (else ``--map-root-user``: an unprivileged user namespace, where the overlay mount is allowed).
    """
    kueue = [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config_file}",
             f"--feature-gates={FEATURE_GATES}", "--zap-devel=false", "--zap-encoder=console"]
    unshare = ["unshare", "--mount", "--propagation", "private", *([] if as_root else ["--map-root-user"])]
    return [*unshare, "sh", "-c", _OVERLAY_ETC, "kueue-etc-overlay", str(etc_upper), str(etc_work), *kueue]


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crds(config_dir: Path, *, port: int, ca_cert: bytes) -> list[dict]:
    """Kueue's CRDs (``crd/bases``) with the conversion-webhook patches its ``crd/kustomization.yaml`` lists
    applied: those CRDs convert between versions through the controller's ``/convert`` at
    ``https://127.0.0.1:<port>``.

    Raises KueueConfigError when there are none, one is not a CRD, or a listed patch names no CRD.
    """
    found = [doc for f in sorted((config_dir / "crd" / "bases").glob("*.yaml")) for doc in _docs(f)]
    if not found or any(d.get("kind") != "CustomResourceDefinition" for d in found):
        raise KueueConfigError(f"{config_dir / 'crd'}: expected Kueue's CRDs")
    bundle = base64.b64encode(ca_cert).decode()
    kustomization = yaml.safe_load((config_dir / "crd" / "kustomization.yaml").read_text())
    for entry in kustomization.get("patches") or []:
        patch = _docs(config_dir / "crd" / entry["path"])[0]
        conversion = patch["spec"]["conversion"]
        path = conversion["webhook"]["clientConfig"]["service"]["path"]
        if not any(crd["metadata"]["name"] == patch["metadata"]["name"] for crd in found):
            raise KueueConfigError(f"{entry['path']} patches {patch['metadata']['name']}, which is not among the CRDs")
        for crd in found:
            if crd["metadata"]["name"] == patch["metadata"]["name"]:
                crd["spec"]["conversion"] = {
                    "strategy": conversion["strategy"],
                    "webhook": {"clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle},
                                "conversionReviewVersions": conversion["webhook"]["conversionReviewVersions"]}}
    return found


def rbac(config_dir: Path, *, user: str) -> list[dict]:
    """The module's manager ClusterRole (``rbac/role.yaml``) and its Role on Secrets in NAMESPACE
    (``rbac/manager_secrets_role.yaml``: the manager watches its namespace's Secrets and waits for that cache
    before starting most controllers), renamed with NAME_PREFIX, each bound to ``user``."""
    (role,) = [d for d in _docs(config_dir / "rbac" / "role.yaml") if d.get("kind") == "ClusterRole"]
    (secrets,) = [d for d in _docs(config_dir / "rbac" / "manager_secrets_role.yaml") if d.get("kind") == "Role"]
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    out = []
    for obj, binding_kind in ((role, "ClusterRoleBinding"), (secrets, "RoleBinding")):
        name = NAME_PREFIX + obj["metadata"]["name"]
        meta = {"name": name, **({"namespace": NAMESPACE} if obj["kind"] == "Role" else {})}
        out.append({**obj, "metadata": meta})
        out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding_kind,
                    "metadata": {**meta, "name": f"{name}-binding"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": obj["kind"], "name": name},
                    "subjects": subject})
    return out


def _kustomized_webhooks(webhook_dir: Path) -> list[dict]:
    """The webhook configurations of ``webhook/kustomization.yaml``'s resources with its inline strategic
    ``patches`` (each a partial configuration whose webhooks, by name, get the patch's fields) applied."""
    kustomization = yaml.safe_load((webhook_dir / "kustomization.yaml").read_text())
    configs = [d for r in kustomization.get("resources", []) for d in _docs(webhook_dir / r)
               if d.get("kind") in WEBHOOK_KINDS]
    for entry in kustomization.get("patches", []):
        patch = yaml.safe_load(entry["patch"]) if "patch" in entry else _docs(webhook_dir / entry["path"])[0]
        matches = [c for c in configs if c["kind"] == patch.get("kind")
                   and c["metadata"]["name"] == patch["metadata"]["name"]]
        if len(matches) != 1:
            raise KueueConfigError(f"{webhook_dir}: a patch targets {patch.get('kind')} {patch['metadata']['name']}, "
                                   f"found {len(matches)} webhook configurations")
        by_name = {w["name"]: w for w in matches[0]["webhooks"]}
        for change in patch.get("webhooks", []):
            if change["name"] not in by_name:
                raise KueueConfigError(f"{webhook_dir}: a patch names webhook {change['name']}, which is not there")
            by_name[change["name"]].update({k: v for k, v in change.items() if k != "name"})
    if not configs:
        raise KueueConfigError(f"{webhook_dir}: no webhook configurations")
    return configs


def _groups(webhook: dict) -> set[str]:
    return {g for r in webhook.get("rules", []) for g in r.get("apiGroups", [])}


def _matches_pods(webhook: dict) -> bool:
    return any("" in r.get("apiGroups", []) and {"pods", "*"} & set(r.get("resources", []))
               for r in webhook.get("rules", []))


def _selects_lws_pods_only(webhook: dict) -> bool:
    selector = webhook.get("objectSelector") or {}
    if LWS_POD_LABEL in (selector.get("matchLabels") or {}):
        return True
    return any(e.get("key") == LWS_POD_LABEL and e.get("operator") in ("Exists", "In")
               for e in selector.get("matchExpressions") or [])


def check_scoped(configs: list[dict]) -> None:
    """Raise KueueConfigError unless every webhook admits only Kueue's and LWS's objects and LWS pods."""
    for config in configs:
        for webhook in config.get("webhooks", []):
            where = f"{config['kind']} {config['metadata']['name']} webhook {webhook.get('name')}"
            if _matches_pods(webhook):
                if not _selects_lws_pods_only(webhook):
                    raise KueueConfigError(f"{where} matches pods without an objectSelector on {LWS_POD_LABEL}")
                continue
            groups = _groups(webhook)
            if not groups or groups - WEBHOOK_GROUPS:
                raise KueueConfigError(f"{where} matches API groups {sorted(groups - WEBHOOK_GROUPS) or ['*']} "
                                       f"outside {sorted(WEBHOOK_GROUPS)}")


def webhook_configurations(config_dir: Path, *, port: int, ca_cert: bytes) -> list[dict]:
    """Kueue's webhook configurations for this cluster, served by the local controller.

    Kept: the webhooks of Kueue's own group and of LeaderWorkerSets, and the pod webhooks
    with an ``objectSelector`` on LWS_POD_LABEL added; dropped: every other integration's
    (Jobs, Deployments, StatefulSets, Ray, Kubeflow ...: not enabled here). Each webhook's
    ``clientConfig.service.path`` becomes ``url: https://127.0.0.1:<port><path>`` with
    ``caBundle``; names get NAME_PREFIX; rules, failurePolicy and the rest are the module's.
    Raises KueueConfigError when a webhook has no service path or the result is not scoped.
    """
    bundle = base64.b64encode(ca_cert).decode()
    result = []
    for config in _kustomized_webhooks(config_dir / "webhook"):
        webhooks = []
        for webhook in config.get("webhooks", []):
            path = ((webhook.get("clientConfig") or {}).get("service") or {}).get("path")
            if not path:
                raise KueueConfigError(f"webhook {webhook.get('name')} has no clientConfig.service.path")
            if _matches_pods(webhook):
                webhook = {**webhook, "objectSelector": {
                    "matchExpressions": [{"key": LWS_POD_LABEL, "operator": "Exists"}]}}
            elif not _groups(webhook) or _groups(webhook) - WEBHOOK_GROUPS:
                continue
            webhooks.append({**webhook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                                         "caBundle": bundle}})
        if webhooks:
            result.append({**config, "metadata": {"name": NAME_PREFIX + config["metadata"]["name"]},
                           "webhooks": webhooks})
    check_scoped(result)
    return result


def webhook_paths(configs: list[dict], crd_list: list[dict] = ()) -> list[str]:
    """The URL paths the configurations (and the CRDs' conversion webhooks) call, to wait until each is served."""
    urls = [w["clientConfig"]["url"] for c in configs for w in c["webhooks"]]
    urls += [c["spec"]["conversion"]["webhook"]["clientConfig"]["url"] for c in crd_list
             if (c["spec"].get("conversion") or {}).get("strategy") == "Webhook"]
    return sorted({urlsplit(u).path for u in urls})


#: Resources an engine pod requests besides GPUs, with an ample quota: a ClusterQueue must cover every
#: resource a Workload requests (Kueue refuses the Workload otherwise); the pods' RDMA NICs are ``rdma/hca``.
AMPLE: dict[str, str] = {"cpu": "100000", "memory": "1000Ti", "rdma/hca": "10000"}


def queue_objects(*, name: str, namespace: str, node_labels: dict[str, str], gpus: int,
                  gpu_resource: str = "nvidia.com/gpu", levels: tuple[str, ...] = (CLIQUE_LABEL, HOSTNAME_LABEL),
                  ample: dict[str, str] | None = None) -> list[dict]:
    """A Topology (``levels``), a ResourceFlavor of the nodes with ``node_labels`` on it, a ClusterQueue with
    ``gpus`` GPUs of quota (and :data:`AMPLE` quota of the rest), and a LocalQueue ``name`` in ``namespace``.

    Cluster-scoped names are ``name``; the shapes are Kueue's v1beta2 API
    (apis/kueue/v1beta2: topology_types.go, resourceflavor_types.go, clusterqueue_types.go).
    """
    rest = dict(AMPLE if ample is None else ample)
    return [
        {"apiVersion": API_VERSION, "kind": "Topology", "metadata": {"name": name},
         "spec": {"levels": [{"nodeLabel": level} for level in levels]}},
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
         "spec": {"nodeLabels": dict(node_labels), "topologyName": name}},
        {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": [*rest, gpu_resource],
             "flavors": [{"name": name, "resources": [
                 *({"name": r, "nominalQuota": q} for r, q in rest.items()),
                 {"name": gpu_resource, "nominalQuota": gpus}]}]}]}},
        {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
         "spec": {"clusterQueue": name}},
    ]
