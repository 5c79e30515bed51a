"""The stages of one role's startup the oracle runs, and the phase of SGLang's startup each belongs to.

Pure (no torch, no sglang): read by :mod:`.judge` in the caller's process and by
:mod:`.engine_side` in the workers. A refusal's ``stage`` is where the oracle caught it;
its ``phase`` is the part of SGLang's startup that refused, as a person (and the
differential's matrix) groups them: the argument checks ``launch_server`` makes
(``args``), the scheduler's model construction (``model``), the PD peer facts of the KV
cache (``kv``), the scheduler's memory planning and KV pool assembly (``memory``), its PD
queues (``pd-queues``), the transfer backend's manager (``transfer``), and the pair's
bootstrap registration and handshake (``handshake``).
"""

from __future__ import annotations

#: One role's stages, in SGLang's order.
STAGES = ("parse", "resolve", "validate", "model", "kv", "memory", "pools", "pd-queues", "transfer")
#: stage -> phase (the pair's stages included).
PHASES = {"parse": "args", "resolve": "args", "validate": "args", "model": "model", "kv": "kv",
          "memory": "memory", "pools": "memory", "pd-queues": "pd-queues", "transfer": "transfer",
          "bootstrap": "handshake", "handshake": "handshake"}


class OracleLimit(RuntimeError):
    """The oracle cannot run this part of SGLang (a collective across processes, a step that
    needs the GPU): no verdict."""
