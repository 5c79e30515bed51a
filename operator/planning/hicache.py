"""HiCache flags and the shared storage tier's config for one role (pure).

SGLang 0.5.23 HiCache (``--enable-hierarchical-cache``, ``arg_groups/fields/memory.py``)
keeps KV pages beyond GPU memory in host memory and, with ``--hicache-storage-backend``,
in a shared L3 store. The operator renders it on prefill (decode turns its radix cache
off under PD, so HiCache would hold nothing there); with ``decodeOffload`` decode writes
finished requests' KV to the same store (``--disaggregation-decode-enable-offload-kvcache``,
``disaggregation/decode_kvcache_offload_manager.py``, which reads the same extra config).

Namespacing (why a tag): HiCache storage keys carry the model name and the page hash but
not the KV layout (DeepSeek-V4 host pools set no ``storage_format_tag``; seed 003), so two
deployments whose layouts differ would read each other's bytes from one store. The tag
derived from the compat key goes where it changes the key:

- mooncake: ``extra_backend_tag``. ``MooncakeStore.__init__`` builds
  ``config_prefix = "<extra_backend_tag>_<model name>"`` and ``_tag_keys`` prepends it to
  every object key (``mem_cache/storage/mooncake_store/mooncake_store.py``).
  ``tenant_id`` does not change keys: it is passed to ``MooncakeDistributedStore.setup``
  and only means something on a master started with ``--enable_multi_tenants``; the
  operator leaves it at ``default``.
- file: the directory, ``file_storage_path = <mount>/<tag>`` (``HiCacheFile`` keys are
  file names under it).

Replicas of one compat group render the same tag and share pages; a group with another
key never sees them. The Mooncake store config is the extra config SGLang's
``MooncakeStoreConfig.load_from_extra_config`` reads (it wins over the config file and the
MOONCAKE_* variables whenever it names ``master_server_address``).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.utils import parse_quantity

from ..api.v1alpha1 import HiCacheSpec, MooncakeStorageSpec, PDDeploymentSpec
from .roles import Role

TAG_PREFIX = "sglpd"
FILE_STORAGE_MOUNT = "/var/cache/sglang-hicache"
MASTER_COMPONENT = "mooncake-master"
#: Mooncake's peer-to-peer handshake: no etcd or HTTP metadata server needed.
METADATA_SERVER = "P2PHANDSHAKE"
#: SGLang reads this (env wins over the extra config) as the address peers reach this pod on.
LOCAL_HOSTNAME_ENV = "MOONCAKE_LOCAL_HOSTNAME"


def hicache_spec(spec: PDDeploymentSpec) -> HiCacheSpec | None:
    """The spec's HiCache block, or None when HiCache is off."""
    return spec.kvCache.hicache


def storage_backend(spec: PDDeploymentSpec) -> str | None:
    """mooncake or file when HiCache has a shared tier, else None."""
    hc = hicache_spec(spec)
    if hc is None or hc.storage.backend == "none":
        return None
    return hc.storage.backend


def storage_tag(compat_key: str) -> str:
    """The key namespace of one compat group in the shared store, e.g. ``sglpd-3f2a9c01de``."""
    return f"{TAG_PREFIX}-{compat_key}"


def master_service_name(name: str) -> str:
    """Name of the Mooncake master's Deployment and Service of PDDeployment ``name``."""
    return f"{name}-{MASTER_COMPONENT}" if name else MASTER_COMPONENT


def master_host(name: str, namespace: str) -> str:
    """In-cluster DNS name of the master's Service."""
    return f"{master_service_name(name)}.{namespace}.svc"


def store_protocol(spec: PDDeploymentSpec, *, rdma: bool) -> str:
    """rdma or tcp: the spec's choice, else rdma exactly when KV transfer uses RDMA."""
    hc = hicache_spec(spec)
    mc = hc.storage.mooncake if hc is not None else None
    if mc is not None and mc.protocol:
        return mc.protocol
    return "rdma" if rdma else "tcp"


def mooncake_extra_config(
    *, spec: PDDeploymentSpec, name: str, namespace: str, compat_key: str, rdma: bool, device_name: str | None
) -> dict[str, Any]:
    """The --hicache-storage-backend-extra-config of the mooncake backend.

    Keys are those ``MooncakeStoreConfig.load_from_extra_config`` reads (sglang 0.5.23):
    master_server_address, master_metrics_port (SGLang's ``check_server`` polls it),
    metadata_server, protocol, device_name (the pod's NICs: Mooncake splits the segment
    over them), global_segment_size in bytes (SGLang divides it by tp x pp per rank), plus
    ``extra_backend_tag``, the compat group's key namespace. ``local_hostname`` is left to
    the MOONCAKE_LOCAL_HOSTNAME variable (the pod IP), which SGLang prefers.
    ``check_server`` stays off: SGLang's check waits for ``/get_all_segments`` to be
    non-empty, which a fresh master only is after a first client mounted a segment, so the
    first engine would wait out its 600 s timeout. Readiness of the master is the
    operator's ``KVStoreReady`` condition instead (reconcilers/kvstore.py).
    """
    hc = hicache_spec(spec)
    assert hc is not None and hc.storage.backend == "mooncake"
    mc = hc.storage.mooncake or MooncakeStorageSpec()
    protocol = store_protocol(spec, rdma=rdma)
    return {
        "master_server_address": f"{master_host(name, namespace)}:{mc.master.rpcPort}",
        "master_metrics_port": mc.master.metricsPort,
        "metadata_server": METADATA_SERVER,
        "protocol": protocol,
        "device_name": (device_name or "") if protocol == "rdma" else "",
        "global_segment_size": quantity_bytes(mc.globalSegmentSize),
        "extra_backend_tag": storage_tag(compat_key),
    }


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity (``16Gi``) as whole bytes."""
    return int(parse_quantity(text))


def file_extra_config(*, compat_key: str) -> dict[str, Any]:
    """The file backend's extra config: one directory per compat group."""
    return {"file_storage_path": f"{FILE_STORAGE_MOUNT}/{storage_tag(compat_key)}"}


def hicache_args(
    *,
    spec: PDDeploymentSpec,
    role: Role,
    name: str,
    namespace: str,
    compat_key: str | None,
    rdma: bool,
    devices: tuple[str, ...],
) -> list[str]:
    """HiCache flags of ``role``: prefill gets the cache, decode only the offload to storage.

    ``devices`` are the pod's RDMA NICs (the store's ``device_name``). Without a compat key
    (planning before the key is known) no storage flags are rendered.
    """
    hc = hicache_spec(spec)
    if hc is None:
        return []
    backend = storage_backend(spec)
    args: list[str] = []
    if role == "prefill":
        args.append("--enable-hierarchical-cache")
        if hc.hostRatio is not None:
            args += ["--hicache-ratio", _number(hc.hostRatio)]
        args += ["--hicache-write-policy", hc.writePolicy]
    elif not hc.decodeOffload:
        return []
    else:
        args.append("--disaggregation-decode-enable-offload-kvcache")
    if backend is None or compat_key is None:
        return args
    if backend == "mooncake":
        extra = mooncake_extra_config(
            spec=spec, name=name, namespace=namespace, compat_key=compat_key, rdma=rdma,
            device_name=",".join(devices) if devices else None,
        )  # fmt: skip
    else:
        extra = file_extra_config(compat_key=compat_key)
    args += [
        "--hicache-storage-backend", backend,
        "--hicache-storage-backend-extra-config", json.dumps(extra, separators=(",", ":"), sort_keys=True),
    ]  # fmt: skip
    return args


def segment_bytes(spec: PDDeploymentSpec, role: Role) -> int:
    """Host memory one pod of ``role`` lends to the Mooncake Store (0 when it lends none)."""
    hc = hicache_spec(spec)
    if storage_backend(spec) != "mooncake" or hc is None:
        return 0
    if role == "decode" and not hc.decodeOffload:
        return 0
    mc = hc.storage.mooncake or MooncakeStorageSpec()
    return quantity_bytes(mc.globalSegmentSize)


def _number(x: float) -> str:
    """A float flag value without a trailing .0 for whole numbers (2.0 -> 2, 1.5 -> 1.5)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))
