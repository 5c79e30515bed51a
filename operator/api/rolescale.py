"""The ``PDRoleScale`` custom resource (short name ``pdrs``): the scale target of one role of a PDDeployment.

Why a kind of its own: a role's pods belong to a Deployment per compat group, named after
the group (``<name>-<group id>-<role>``), and a paired rollout replaces that Deployment
with another one. An HPA or a KEDA ScaledObject pointed at it would lose its target at
every rollout. A PDRoleScale is named after the PDDeployment and the role
(``<name>-prefill``, ``<name>-decode``), lives as long as the role's count is not set in
the PDDeployment (``spec.<role>.replicas`` omitted) and serves the ``/scale`` subresource:
``spec.replicas`` is the count, ``status.replicas`` the serving group's pods and
``status.selector`` (``pd.sglang-operator.io/deployment=<name>,pd.sglang-operator.io/role=
<role>``) selects the role's pods of every group, so it stays the same across rollouts.
``kubectl scale``, an HPA (``autoscaling/v2``, ``scaleTargetRef`` kind PDRoleScale) and
KEDA use it unchanged; so does the operator's built-in planner (``spec.autoscaling``).

The name follows what the user scales (a role of a PD deployment), the way
``autoscaling/v1`` names its ``Scale``; the peers' "scaling adapter" (Dynamo's
DynamoGraphDeploymentScalingAdapter, RBG's RoleBasedGroupScalingAdapter) names how it is
built instead. Like the other kinds, this model is the one source of its CRD
(``crds/pdrolescales.yaml``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .v1alpha1 import API_VERSION, Condition, CustomObject, _Model

KIND = "PDRoleScale"
PLURAL = "pdrolescales"
SHORT_NAME = "pdrs"

#: Paths of the ``/scale`` subresource (apiextensions.k8s.io/v1 CustomResourceSubresourceScale).
SPEC_REPLICAS_PATH = ".spec.replicas"
STATUS_REPLICAS_PATH = ".status.replicas"
LABEL_SELECTOR_PATH = ".status.selector"


class PDRoleScaleSpec(_Model):
    """The desired count of the role; written through ``/scale`` by kubectl scale, an HPA, KEDA or the planner."""

    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description=(
            "Replicas of the role. The operator applies it to the serving compat group (and to a new group while "
            "it rolls out, within spec.rollout.maxSurgeGPUs). 0 stops the role (only when asked: the planner "
            "never goes below minReplicas)."
        ),
    )


class PDRoleScaleStatus(BaseModel):
    """Observed state, written by the operator (the ``/scale`` subresource reads replicas and selector)."""

    model_config = ConfigDict(extra="allow")

    replicas: int = Field(default=0, description="Pods of the role in the serving compat group (status.replicas of its workload).")
    readyReplicas: int = Field(default=0, description="Ready pods of the role in the serving compat group.")
    selector: str = Field(
        default="",
        description="Label selector of the role's pods in every compat group (HPA reads it through /scale).",
    )
    deployment: str = Field(default="", description="The PDDeployment.")
    role: Literal["prefill", "decode", ""] = Field(default="", description="The role.")
    controller: str = Field(
        default="none",
        description="Who sets spec.replicas: planner, HorizontalPodAutoscaler/<name> (an HPA or KEDA's) or none.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description=("Applied: True once the PDDeployment's current generation was reconciled with this count; "
                     "False while that generation is not applied (refused by a rule or by SGLang, or a dependency "
                     "missing), with the PDDeployment's reason: the count then waits and the running pods stay."),
    )


class PDRoleScale(CustomObject):
    """PDRoleScale is the scale target of one role (prefill or decode) of a PDDeployment: kubectl scale,
    an HPA or KEDA scale the role through its /scale subresource; its name and selector survive paired
    rollouts. The operator creates one per role whose spec.<role>.replicas is omitted."""

    apiVersion: Literal["pd.sglang-operator.io/v1alpha1"] = API_VERSION
    kind: Literal["PDRoleScale"] = KIND
    spec: PDRoleScaleSpec
