"""What the operator's SLO measurement found for a deployment: plain values, no I/O.

:class:`Health` is what one pass of the SLO scraper (``scraper.py``) hands the operator
for one PDDeployment; :class:`MasterHealth` one look at its Mooncake Store master
(``kvstore.py`` probes it). The reconcilers read both to write status
(``reconcilers/status.py``), so they live here, apart from the modules that do the
HTTP: importing this module pulls no HTTP client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .slo import KVTransferResult, SLOResult


@dataclass(frozen=True)
class MasterHealth:
    """One look at the master.

    ``deployment_ready``: the master's Deployment has an available replica, or (from the
    scraper) its pod is Ready; None when the API was not asked, e.g. a test probing a
    process directly. ``exists``: False when there is no master Deployment / pod to probe
    (None: not asked). ``reachable``: ``/health`` answered; ``ready``: it said ``status:
    ok`` and ``service_ready: true`` (and the Deployment / pod is ready when that was
    asked). ``metrics``: every unlabelled sample of ``/metrics`` (name -> value; empty when
    the scrape failed). ``error``: why it is not ready, for the condition message.
    """

    url: str
    reachable: bool
    ready: bool
    deployment_ready: bool | None = None
    role: str | None = None
    state: str | None = None
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    exists: bool | None = None

    @property
    def keys(self) -> float | None:
        """Objects in the store (``master_key_count``)."""
        return self.metrics.get("master_key_count")

    def describe(self) -> str:
        """One line for a condition message."""
        if not self.ready:
            return f"Mooncake master at {self.url}: {self.error or 'not ready'}"
        m = self.metrics
        parts = [f"Mooncake master at {self.url} serves ({self.role or 'leader'})"]
        if "master_key_count" in m:
            parts.append(f"{int(m['master_key_count'])} keys")
        if "master_total_capacity_bytes" in m:
            parts.append(
                f"{_gib(m.get('master_allocated_bytes', 0.0))} of {_gib(m['master_total_capacity_bytes'])} GiB used"
            )
        if "master_active_clients" in m:
            parts.append(f"{int(m['master_active_clients'])} clients")
        return ", ".join(parts)

    def view(self) -> tuple:
        """What the ``KVStoreReady`` condition shows of this look (for "did anything change?")."""
        return (self.ready, self.reachable, self.deployment_ready, self.exists, self.describe())


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f}"


@dataclass(frozen=True)
class Health:
    """What the latest scrape of one PDDeployment found (handed to ``on_health``).

    ``evaluated_at``: Unix time. ``ready`` / ``reachable``: per role (prefill, decode,
    gateway), the serving group's ready pods and how many of them answered ``/metrics``.
    ``slo``: the evaluation of ``spec.slo`` (None without one). ``kv_transfer``: KV
    transfer latency and failures over the SLO window (5m without ``spec.slo``).
    ``kvstore``: this pass's look at the Mooncake Store master (None without Mooncake
    storage). ``source``: what produced the figures (``scrape``: the scraper;
    ``prometheus``: ``prometheus_source``). ``problem``: (reason, message) when no figures
    could be read this interval (e.g. ``PrometheusUnavailable``): ``slo`` is then None and
    ``SLOMet`` Unknown with that reason.
    """

    namespace: str
    name: str
    serving_key: str | None
    evaluated_at: float
    ready: Mapping[str, int]
    reachable: Mapping[str, int]
    slo: SLOResult | None
    kv_transfer: KVTransferResult
    kvstore: MasterHealth | None = None
    source: str = "scrape"
    problem: tuple[str, str] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def restamped(self, at: float) -> Health:
        """This health as evaluated at Unix time ``at`` (and its ``slo``), every other part the same object."""
        slo = None if self.slo is None else _moved(self.slo, at)
        health = _moved(self, at)
        object.__setattr__(health, "slo", slo)
        return health

    def same_but_time(self, other: Health) -> bool:
        """Whether ``other`` says what this health says, evaluated at another time: every field
        equal but ``evaluated_at`` (of the health and of its ``slo``). A pass over a deployment
        whose inputs did not change hands in such a health (its parts are the same objects,
        so the comparison is short)."""
        return _equal_but_time(self, other)


def _moved(obj: Any, at: float) -> Any:
    """A shallow copy of the frozen dataclass ``obj`` with ``evaluated_at`` = ``at``, without
    ``dataclasses.replace``'s ``__init__`` call (a third of a pass over silent deployments)."""
    copy = object.__new__(type(obj))
    copy.__dict__.update(obj.__dict__)
    object.__setattr__(copy, "evaluated_at", at)
    return copy


def _equal_but_time(a: object, b: object) -> bool:
    """Dataclasses ``a`` and ``b`` of one type equal in every field but ``evaluated_at``
    (an ``SLOResult`` field is compared the same way)."""
    if type(a) is not type(b):
        return False
    for f in fields(a):  # type: ignore[arg-type]
        if f.name == "evaluated_at":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x is y:
            continue
        if isinstance(x, SLOResult):
            if not _equal_but_time(x, y):
                return False
        elif x != y:
            return False
    return True
