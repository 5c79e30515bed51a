"""Vendor kernel plugin rules: GPU, TP size, model, features, weight updates.

Source: sglang 0.5.23 kernels/plugin_kernels/<vendor>/spec.py (Requirements: isas,
tp_sizes, dtypes, decode graph backends; Feature: refused unless the spec lists it),
srt/kernel_plugins/<vendor>/binding.py (startup refusal listing every reason; online
weight updates refused because built kernels hold weight-derived state), the plugin
README (plugins serve small-batch decode and verify steps: rendered on decode only),
and the catalog kernels/plugins.yaml.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import FEATURE_DESCRIPTIONS, VENDOR_FEATURES, parse_flags
from ..structs import RolePlan
from ..problems import Problem

PLUGIN_DESTS = ("enable_nvidia_megakernel", "enable_amd_monokernel")


def plugin_in_catalog(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The plugin named in spec.kernels.plugin must be in the plugin catalog."""
    name = spec.kernels.plugin
    if name == "none" or role.role != "decode" or catalog.plugin(name) is not None:
        return []
    return [
        Problem(
            field="spec.kernels.plugin",
            message=f"kernel plugin {name!r} is not in the plugin catalog",
            fix=f"use one of: none, {', '.join(sorted(catalog.plugins))}",
            rule="plugin_in_catalog",
        )
    ]


def plugin_matches_gpu(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The plugin's spec must name the role's ISA (Requirements.isas; spec.find_spec refuses others)."""
    plugin, acc = role.inputs.plugin, role.inputs.accelerator
    if plugin is None or acc is None or acc.isa in plugin.isas:
        return []
    return [
        Problem(
            field="spec.kernels.plugin",
            message=f"{spec.kernels.plugin} supports {', '.join(plugin.isas)}, not {role.inputs.accelerator_name} "
            f"({acc.isa}) of the {role.role} role",
            fix="use kernels.plugin none on this accelerator, or the vendor's plugin "
            "(sgl-nvidia-mega on SM100/SM103, sgl-amd-mono on gfx950)",
            rule="plugin_matches_gpu",
        )
    ]


def plugin_tp_size(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The role's TP size must be one the plugin's spec lists (Requirements.tp_sizes)."""
    plugin = role.inputs.plugin
    tp = role.inputs.parallelism.tp
    if plugin is None or not plugin.tpSizes or tp in plugin.tpSizes:
        return []
    return [
        Problem(
            field=f"spec.{role.role}.parallelism.tp",
            message=f"{spec.kernels.plugin} is built for TP sizes {list(plugin.tpSizes)}, not {tp}",
            fix=f"set tp to one of {list(plugin.tpSizes)} or kernels.plugin none",
            rule="plugin_tp_size",
        )
    ]


def plugin_model(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The model's architecture (and model_type) must have a spec in the plugin (spec.find_spec).

    An unknown model is a warning: the plugin may or may not serve it.
    """
    plugin, model = role.inputs.plugin, role.inputs.model
    if plugin is None:
        return []
    if model is None:
        return [
            Problem(
                field="spec.kernels.plugin",
                message=f"cannot check that {spec.kernels.plugin} serves model {spec.model.name!r} (not in the model "
                "catalog); SGLang stops the server if no spec is registered for its architecture",
                fix="add the model to the model catalog, or set kernels.plugin none",
                rule="plugin_model",
                severity="warning",
            )
        ]
    ok = model.architecture in plugin.architectures and (not plugin.modelTypes or model.modelType in plugin.modelTypes)
    if ok:
        return []
    return [
        Problem(
            field="spec.kernels.plugin",
            message=f"{spec.kernels.plugin} has specs for {list(plugin.modelTypes or plugin.architectures)}, not "
            f"{spec.model.name} ({model.architecture}, {model.modelType})",
            fix="set kernels.plugin none for this model",
            rule="plugin_model",
        )
    ]


def plugin_features(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Every SGLang feature the role's arguments turn on must be accepted by the plugin's spec.

    Features are computed from the rendered args with SGLang's probes (features.py), the
    ones the plugin vendor's binding probes; ``refused`` in the catalog is a refusal,
    ``unknown`` a warning naming the risk.
    Source: spec.py Feature ("refused unless a spec lists them"), binding.py FEATURE_PROBES.
    """
    plugin = role.inputs.plugin
    if plugin is None:
        return []
    problems = []
    for feature in sorted(role.features & VENDOR_FEATURES[plugin.vendor]):
        support = plugin.features.get(feature, "unknown")
        what = FEATURE_DESCRIPTIONS.get(feature, feature)
        if support == "accepted":
            continue
        if support == "refused":
            problems.append(
                Problem(
                    field="spec.kernels.plugin",
                    message=f"{spec.kernels.plugin} {plugin.package.version} refuses {what}, which the {role.role} "
                    "role uses; SGLang stops the server at startup",
                    fix=f"turn off {what} on the {role.role} role or set kernels.plugin none",
                    rule="plugin_features",
                )
            )
        else:
            problems.append(
                Problem(
                    field="spec.kernels.plugin",
                    message=f"the catalog does not know whether {spec.kernels.plugin} {plugin.package.version} "
                    f"accepts {what}, which the {role.role} role uses; if its spec does not list it, SGLang stops "
                    "the server at startup",
                    fix="confirm with the plugin's spec and record it in the catalog ConfigMap (plugins.yaml), "
                    "or set kernels.plugin none",
                    rule="plugin_features",
                    severity="warning",
                )
            )
    return problems


def plugin_no_weight_updates(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """RL rollouts update weights online; a plugin's kernels hold weight-derived state and refuse it.

    Source: seed 003 (the NVIDIA binding sets an online weight update refusal); binding.py.
    """
    if role.inputs.plugin is None or not spec.rlRollout:
        return []
    return [
        Problem(
            field="spec.kernels.plugin",
            message=f"{spec.kernels.plugin} refuses online weight updates (its kernels hold state derived from the "
            "weights), and spec.rlRollout says this deployment receives them",
            fix="set kernels.plugin none for RL rollouts, or rlRollout false",
            rule="plugin_no_weight_updates",
        )
    ]


def one_plugin_flag(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Never both plugin flags on one engine (each binding replaces the model's forward).

    Read by SGLang dest, so the deprecated alias ``--monokernel-backend amd`` counts too.
    """
    flags = parse_flags(role.command.args)
    if not all(flags.get(dest) not in (None, False) for dest in PLUGIN_DESTS):
        return []
    return [
        Problem(
            field=f"spec.{role.role}.extraArgs",
            message="both --enable-nvidia-megakernel and --enable-amd-monokernel are set",
            fix="choose one plugin in spec.kernels.plugin and remove plugin flags from extraArgs",
            rule="one_plugin_flag",
        )
    ]
