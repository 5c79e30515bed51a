"""Which GPUs an engine container sees when its env narrows them (pure).

In a Kubernetes pod the NVIDIA / AMD device plugin gives the container exactly the GPUs it
requests, numbered from 0, with no visibility variable set. A user's ``env`` can still
narrow them: CUDA (and HIP, which honours the same variable) enumerate only the devices
``CUDA_VISIBLE_DEVICES`` lists; ROCm also reads ``HIP_VISIBLE_DEVICES`` and
``ROCR_VISIBLE_DEVICES``. SGLang then places rank ``r`` of a pod on GPU ``base + r``
(entrypoints/engine.py ``_launch_scheduler_processes``); a rank past the visible count
fails with "CUDA error: invalid device ordinal". The SGLang oracle emulates the narrowed
count (``oracle/emulation.py`` ``pod_gpus``), and the rule ``visible_devices_cover_pod``
refuses it before any pod exists.

The semantics follow CUDA's documentation of ``CUDA_VISIBLE_DEVICES`` (CUDA C Programming
Guide, "CUDA Environment Variables"): a comma-separated list of indices; the devices before
the first invalid entry are visible (an index out of range, a repeated one, a negative one,
or anything that is not an index: a UUID cannot name a device the plugin picks at
scheduling time); an empty value hides every device.
"""

from __future__ import annotations

from typing import Literal

#: The variables each vendor's runtime narrows devices with, applied in this order.
VISIBLE_DEVICES_ENV: dict[str, tuple[str, ...]] = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}


def visible_count(value: str, count: int) -> int:
    """GPUs visible after one variable with ``value`` narrows ``count`` devices (numbered 0..count-1)."""
    seen: set[int] = set()
    for entry in value.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= count or int(entry) in seen:
            break
        seen.add(int(entry))
    return len(seen)


def visible_gpus(count: int, env: dict[str, str], vendor: Literal["nvidia", "amd"] | str) -> int:
    """GPUs an engine container sees: the ``count`` the device plugin gives it, narrowed by each
    variable of :data:`VISIBLE_DEVICES_ENV` for ``vendor`` that ``env`` sets (name -> value)."""
    for name in VISIBLE_DEVICES_ENV.get(vendor, VISIBLE_DEVICES_ENV["nvidia"]):
        if name in env:
            count = visible_count(env[name], count)
    return count
