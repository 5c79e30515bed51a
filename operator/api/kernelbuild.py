"""The ``KernelBuild`` custom resource (short name ``kb``): one built SGLang kernel cache.

A KernelBuild says *what* to compile: the runtime image, the vendor plugin, the
accelerator, the model and revision, and the role's SGLang flags that change which
kernels get compiled (taken from a PDDeployment's rendered arguments of the role that
will mount the cache). The operator runs a Job on a node of that accelerator which runs
the build recipe of ``kernels/builds.yaml`` with those flags, publishes
``SGLANG_CACHE_DIR`` into a volume (a ReadWriteMany PVC by default) under a
content-addressed directory, and records phase, digest, size and duration in status.

Like :mod:`.v1alpha1`, these models are the one source of the CRD schema
(``crds/kernelbuilds.yaml``); defaults stay in the operator and are stripped from the
schema, so GitOps tools see no drift. Which fields enter the input hash (equal inputs
reuse a finished build) is decided in :mod:`sglang_pd_operator.kernelbuild.inputs`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .v1alpha1 import (
    API_VERSION,
    Condition,
    CustomObject,
    DNSLabel,
    Duration,
    EnvVar,
    KernelPlugin,
    ModelSource,
    Quantity,
    ResourcesSpec,
    _Model,
    cel,
)

KIND = "KernelBuild"
PLURAL = "kernelbuilds"
SHORT_NAME = "kb"

Phase = Literal["Pending", "Building", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = ("Pending", "Building", "Succeeded", "Failed")


class KernelBuildRuntime(_Model):
    """The SGLang runtime image the kernels are compiled in and for.

    SGLang's JIT cache key includes the compilers and the versions of torch, DeepGEMM and
    FlashInfer inside the image (sglang 0.5.23 kernels/jit/utils/compile/cache.py
    ``_environment_fingerprint``), so a cache is only valid for the image it was built in.
    """

    image: str = Field(
        min_length=1, description="Runtime image; must equal the image of the pods that mount the cache."
    )
    sglangVersion: str = Field(
        pattern=r"^0\.5\.(2[3-9]|[3-9][0-9])(\.post[0-9]+)?$",
        description="SGLang version inside the image; 0.5.23 is the first supported.",
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the build container."
    )


class KernelBuildPlugin(_Model):
    """The vendor kernel plugin the role renders (none for prefill: plugins cover decode steps only)."""

    name: KernelPlugin = Field(default="none", description="none, sgl-nvidia-mega or sgl-amd-mono.")
    version: str | None = Field(
        default=None, description="Plugin version; default: the version pinned in the kernel catalog."
    )


class KernelBuildModel(_Model):
    """The model whose shapes decide which kernels are compiled."""

    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)?$",
        description="Model id, e.g. deepseek-ai/DeepSeek-V4.1-Flash.",
    )
    revision: str = Field(
        min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._/-]+$", description="Model revision (--revision)."
    )
    source: ModelSource = Field(description="Where the build Job reads the weights (the warm-up loads the model).")


class KernelBuildStorage(_Model):
    """Where the published cache lives."""

    type: Literal["pvc"] = Field(
        default="pvc",
        description="pvc: a PersistentVolumeClaim owned by the KernelBuild (OCI artifact push is not implemented yet).",
    )
    size: Quantity = Field(default="100Gi", description="Requested PVC size.")
    storageClassName: str | None = Field(
        default=None, description="StorageClass of the PVC; default: the cluster's default class."
    )
    accessModes: list[Literal["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadWriteMany"],
        min_length=1,
        description=(
            "PVC access modes. ReadWriteMany (default): engine pods on many nodes mount the cache read-only "
            "while the build Job wrote it."
        ),
    )


class KernelBuildRetry(_Model):
    """How failed build attempts are retried: exponential backoff, a bounded number of attempts."""

    maxAttempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Attempts per generation and inputs; a new generation (any spec edit) grants a fresh budget.",
    )
    backoff: Duration = Field(default="1m", description="Wait before the second attempt; doubles for each later one.")
    maxBackoff: Duration = Field(default="30m", description="Longest wait between two attempts.")


class KernelBuildSpec(_Model):
    """What to build. Fields marked 'input' enter the input hash; equal inputs reuse a finished build."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.role == 'decode' || !has(self.plugin) || !has(self.plugin.name) || self.plugin.name == 'none'",
                    "spec.plugin: vendor plugins cover decode steps only; set plugin.name: none for a prefill build",
                    field_path=".plugin",
                ),
            ]
        }
    )

    role: Literal["prefill", "decode"] = Field(
        description="Input. The PD role whose flags are compiled (--disaggregation-mode is among the args)."
    )
    runtime: KernelBuildRuntime = Field(description="Input. The runtime image and SGLang version.")
    accelerator: str = Field(
        min_length=1,
        description=(
            "Input. Accelerator catalog name (gb300, b300, mi355x ...): the Job runs on a node with its labels. "
            "The name, not only the ISA: DeepGEMM specializes kernels by SM count."
        ),
    )
    plugin: KernelBuildPlugin = Field(default_factory=KernelBuildPlugin, description="Input. Vendor kernel plugin.")
    model: KernelBuildModel = Field(description="Input (name, revision). The model and where its weights are.")
    gpus: int = Field(ge=1, le=64, description="Input. GPUs of one engine replica (the Job requests them all).")
    args: list[str] = Field(
        default_factory=list,
        description=(
            "Input. The role's SGLang flags that change which kernels are compiled, as the PDDeployment renders "
            "them, without --model-path, --revision, --host, --port, --served-model-name, --enable-metrics, "
            "--disaggregation-bootstrap-port and --disaggregation-ib-device (the Job sets or drops those)."
        ),
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Input. The role's environment that changes kernels (e.g. SGLANG_DSV4_KV_LAYOUT).",
    )
    recipe: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Input. Build recipe in kernels/builds.yaml; default: the recipe of the accelerator's vendor.",
    )
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, description="CPU, memory, shared memory of the Job."
    )
    storage: KernelBuildStorage = Field(default_factory=KernelBuildStorage, description="Where the cache is published.")
    retry: KernelBuildRetry = Field(default_factory=KernelBuildRetry, description="Retry policy of failed attempts.")
    timeout: Duration = Field(default="2h", description="Deadline of one build attempt (Job activeDeadlineSeconds).")
    retention: Duration | None = Field(
        default=None,
        description=(
            "Delete this KernelBuild (and its PVC) once no PDDeployment has used it for this long. Default: 168h "
            "for builds the operator created (kernels.cache: auto), never for builds a user created."
        ),
    )
    podAnnotations: dict[str, str] = Field(
        default_factory=dict, description="Extra annotations on the build pod (e.g. a service mesh opt-out)."
    )
    builderImage: str | None = Field(
        default=None,
        description=(
            "Image that carries the builder script (the operator image); its init container copies the script "
            "into the build pod. Default: the operator's own image."
        ),
    )


class KernelBuild(CustomObject):
    """A KernelBuild object as read from YAML or the API (status is ignored here)."""

    apiVersion: Literal["pd.sglang-operator.io/v1alpha1"] = API_VERSION
    kind: Literal["KernelBuild"] = KIND
    spec: KernelBuildSpec


# --------------------------------------------------------------------------- status
class KernelBuildFailure(BaseModel):
    """The last failed attempt."""

    model_config = ConfigDict(extra="allow")

    attempt: int = Field(description="Attempt number that failed.")
    reason: str = Field(description="CamelCase reason, e.g. BuildFailed, DeadlineExceeded, NoResult.")
    message: str = Field(default="", description="What failed (the builder's last words or the Job's condition).")
    at: str | None = Field(default=None, description="When it failed (RFC 3339).")


class KernelBuildStatus(BaseModel):
    """Observed state, written only by the operator through the status subresource."""

    model_config = ConfigDict(extra="allow")

    phase: Phase | None = Field(default=None, description="Pending, Building, Succeeded or Failed.")
    observedGeneration: int | None = Field(default=None, description="Last metadata.generation the operator acted on.")
    inputHash: str | None = Field(default=None, description="Hash of the inputs the status describes.")
    inputs: dict[str, Any] | None = Field(default=None, description="The hashed inputs, for humans and diffs.")
    digest: str | None = Field(default=None, description="sha256 over the sorted paths and contents of the cache.")
    path: str | None = Field(default=None, description="Directory of the published cache inside the PVC (subPath).")
    pvcName: str | None = Field(default=None, description="The PVC that holds the cache.")
    sizeBytes: int | None = Field(default=None, description="Bytes of the published cache.")
    files: int | None = Field(default=None, description="Files in the published cache.")
    durationSeconds: float | None = Field(default=None, description="Build time of the successful attempt.")
    complete: bool | None = Field(
        default=None,
        description="A verify run with SGLANG_CRASH_ON_JIT_COMPILE=1 compiled nothing new: safe to forbid runtime JIT.",
    )
    writablePaths: list[str] = Field(
        default_factory=list,
        description="Directories inside the cache that engines write lock files into (mounted writable over it).",
    )
    jobName: str | None = Field(default=None, description="The Job of the latest attempt.")
    attempts: int = Field(default=0, description="Attempts started for these inputs.")
    failedAttempts: int = Field(default=0, description="Failed attempts counted against retry.maxAttempts.")
    lastFailure: KernelBuildFailure | None = Field(default=None, description="The last failed attempt.")
    nextRetryAt: str | None = Field(default=None, description="When the next attempt starts (RFC 3339).")
    retriesExhausted: bool = Field(default=False, description="No attempt is left for this generation.")
    startedAt: str | None = Field(default=None, description="Start of the latest attempt.")
    completedAt: str | None = Field(default=None, description="End of the successful attempt.")
    unusedSince: str | None = Field(default=None, description="Since when no PDDeployment uses this build.")
    message: str | None = Field(default=None, description="Human-readable summary.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Building and Failed conditions.")


def parse_kernelbuild(body: dict[str, Any]) -> KernelBuild:
    """Validate a KernelBuild body (a dict from YAML or the API); raises pydantic.ValidationError."""
    return KernelBuild.model_validate(body)


__all__ = [
    "DNSLabel",
    "KIND",
    "KernelBuild",
    "KernelBuildFailure",
    "KernelBuildModel",
    "KernelBuildPlugin",
    "KernelBuildRetry",
    "KernelBuildRuntime",
    "KernelBuildSpec",
    "KernelBuildStatus",
    "KernelBuildStorage",
    "PHASES",
    "PLURAL",
    "Phase",
    "SHORT_NAME",
    "parse_kernelbuild",
]
