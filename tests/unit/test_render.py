"""Rendering a plan into Kubernetes objects: one renderer for both roles, the SGLang config, labels."""

from __future__ import annotations

import yaml

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.render import render_all
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.render.engine import split_config
from sglang_pd_operator.render.gateway import gateway_args


def _objs(doc, catalog):
    plan = build_plan(parse_pddeployment(doc), catalog)
    assert plan.valid, [p.line() for p in plan.problems]
    return plan, {(o["kind"], o["metadata"]["name"]): o for o in render_all(plan, owner={"apiVersion": "x/v1", "kind": "PDDeployment", "name": "dsv41-flash", "uid": "u1"})}


def test_config_file_round_trips_to_the_same_args(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    key = plan.compat_key
    for role in (plan.prefill, plan.decode):
        dep = objs[("Deployment", f"dsv41-flash-{key[:6]}-{role.role}")]
        (volume,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
        cm = objs[("ConfigMap", volume["configMap"]["name"])]
        assert cm["immutable"] is True and cm["metadata"]["name"].startswith(f"dsv41-flash-{key[:6]}-{role.role}-config-")
        config = yaml.safe_load(cm["data"]["config.yaml"])
        cli = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert cli[:2] == ["--config", "/etc/sglang/config.yaml"]
        # rebuild the argument list the way SGLang's config parser does and compare as flag maps
        rebuilt = []
        for k, v in config.items():
            rebuilt += [f"--{k}"] if v is True else [f"--{k}", str(v)]
        from sglang_pd_operator.planning.features import parse_flags

        assert parse_flags(rebuilt + cli[2:]) == parse_flags(list(role.command.args))
    assert config["disaggregation-mode"] == "decode"


def test_config_file_text_is_remembered_per_command_line_and_equals_a_fresh_render(gb300_doc, catalog):
    from sglang_pd_operator.render.engine import _config_text, config_yaml

    plan, _ = _objs(gb300_doc, catalog)
    for role in (plan.prefill, plan.decode):
        fresh = yaml.safe_dump(split_config(list(role.command.args))[0], sort_keys=False)
        hits = _config_text.cache_info().hits
        assert config_yaml(role) == fresh and config_yaml(role) == fresh
        assert _config_text.cache_info().hits > hits  # the second render is the memo's
    assert config_yaml(plan.prefill) != config_yaml(plan.decode)  # keyed by the role's own command line


def test_dp_attention_switch_stays_on_the_command_line():
    config, cli = split_config(["--tp-size", "4", "--enable-dp-attention", "--dp-size", "4"])
    assert config == {"tp-size": 4, "dp-size": 4} and cli == ["--enable-dp-attention"]


def test_pods_carry_selectors_bootstrap_annotation_resources_and_owner(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    key = plan.compat_key
    pre = objs[("Deployment", f"dsv41-flash-{key[:6]}-prefill")]
    dec = objs[("Deployment", f"dsv41-flash-{key[:6]}-decode")]
    for dep, role, replicas in ((pre, "prefill", 1), (dec, "decode", 2)):
        tmpl = dep["spec"]["template"]
        assert dep["spec"]["replicas"] == replicas
        assert dep["spec"]["selector"]["matchLabels"] == {L.LABEL_DEPLOYMENT: "dsv41-flash", L.LABEL_ROLE: role, L.LABEL_COMPAT_KEY: key}
        assert tmpl["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GB300"}
        res = tmpl["spec"]["containers"][0]["resources"]
        assert res["requests"]["nvidia.com/gpu"] == "4" and res["requests"]["rdma/hca"] == "1"
        assert dep["metadata"]["ownerReferences"][0]["uid"] == "u1"
        assert tmpl["spec"]["containers"][0]["startupProbe"]["failureThreshold"] * 10 >= 1800
    assert pre["spec"]["template"]["metadata"]["annotations"][L.ANNOTATION_BOOTSTRAP_PORT] == "8998"
    assert L.ANNOTATION_BOOTSTRAP_PORT not in dec["spec"]["template"]["metadata"]["annotations"]
    assert "--enable-nvidia-megakernel" not in yaml.safe_dump(pre)  # plugins serve decode steps only
    (decode_cm,) = [o for (kind, n), o in objs.items() if kind == "ConfigMap" and n.startswith(f"dsv41-flash-{key[:6]}-decode-config-")]
    assert "enable-nvidia-megakernel: true" in decode_cm["data"]["config.yaml"]


def test_gateway_selectors_include_the_compat_key(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    args = gateway_args(plan)
    pre = args[args.index("--prefill-selector") + 1 : args.index("--decode-selector")]
    assert f"{L.LABEL_COMPAT_KEY}={plan.compat_key}" in pre and f"{L.LABEL_ROLE}=prefill" in pre
    svc = objs[("Service", "dsv41-flash")]
    assert svc["spec"]["selector"][L.LABEL_COMPAT_KEY] == plan.compat_key
    role = objs[("Role", "dsv41-flash-gateway")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_gateway_placement_and_resources_come_from_the_spec_and_keep_the_group(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    gw = objs[("Deployment", f"dsv41-flash-{plan.compat_key[:6]}-gateway")]["spec"]["template"]["spec"]
    assert "nodeSelector" not in gw and "tolerations" not in gw
    assert gw["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    gb300_doc["spec"]["gateway"].update(
        nodeSelector={"node-role.example.com/cpu": "true"},
        tolerations=[{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}],
        resources={"cpu": "500m", "memory": "1Gi"},
    )
    plan2, objs2 = _objs(gb300_doc, catalog)
    assert plan2.compat_key == plan.compat_key  # gateway placement is not part of the compat key
    gw = objs2[("Deployment", f"dsv41-flash-{plan.compat_key[:6]}-gateway")]["spec"]["template"]["spec"]
    assert gw["nodeSelector"] == {"node-role.example.com/cpu": "true"}
    assert gw["tolerations"] == [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}]
    assert gw["containers"][0]["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


def test_config_change_rolls_pods_and_replicas_do_not(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    key = plan.compat_key
    ann = lambda o, r: o[("Deployment", f"dsv41-flash-{key[:6]}-{r}")]["spec"]["template"]["metadata"]["annotations"][L.ANNOTATION_CONFIG_HASH]  # noqa: E731
    gb300_doc["spec"]["decode"]["replicas"] = 3
    plan2, objs2 = _objs(gb300_doc, catalog)
    assert plan2.compat_key == key and ann(objs2, "decode") == ann(objs, "decode")
    gb300_doc["spec"]["decode"]["extraArgs"] = ["--max-running-requests", "64"]
    plan3, objs3 = _objs(gb300_doc, catalog)
    assert plan3.compat_key == key and ann(objs3, "decode") != ann(objs, "decode") and ann(objs3, "prefill") == ann(objs, "prefill")


def test_omitted_replicas_are_owned_by_the_roles_pdrolescale(gb300_doc, catalog):
    """A role without replicas gets a PDRoleScale named after the deployment and role (no compat key:
    it survives rollouts), seeded at minReplicas (else 1), and its Deployment that count."""
    del gb300_doc["spec"]["decode"]["replicas"]
    plan, objs = _objs(gb300_doc, catalog)
    assert objs[("Deployment", f"dsv41-flash-{plan.compat_key[:6]}-decode")]["spec"]["replicas"] == 1
    scale = objs[("PDRoleScale", "dsv41-flash-decode")]
    assert scale["spec"] == {"replicas": 1}
    assert "pd.sglang-operator.io/compat-key" not in scale["metadata"]["labels"]
    assert scale["metadata"]["labels"]["pd.sglang-operator.io/role"] == "decode"
    assert ("PDRoleScale", "dsv41-flash-prefill") not in objs  # prefill's count is in the spec
    gb300_doc["spec"]["autoscaling"] = {"decode": {"minReplicas": 3, "maxReplicas": 6}}
    plan, objs = _objs(gb300_doc, catalog)
    assert objs[("PDRoleScale", "dsv41-flash-decode")]["spec"] == {"replicas": 3}
    assert objs[("Deployment", f"dsv41-flash-{plan.compat_key[:6]}-decode")]["spec"]["replicas"] == 3


def _deployment(objs, plan, role):
    return objs[("Deployment", f"{plan.name}-{plan.compat_key[:6]}-{role}")]


def test_in_place_updates_surge_within_the_gpu_budget(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    for role in ("prefill", "decode"):
        spec = _deployment(objs, plan, role)["spec"]
        assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}, role
        assert spec["progressDeadlineSeconds"] == 1800  # rollout.progressDeadline 30m: the Deployment reports a stall
    assert _deployment(objs, plan, "gateway")["spec"]["progressDeadlineSeconds"] == 1800
    gb300_doc["spec"]["rollout"] = {"maxSurgeGPUs": 4, "progressDeadline": "90s"}  # one 4-GPU pod: prefill fits, decode not
    plan, objs = _objs(gb300_doc, catalog)
    assert _deployment(objs, plan, "prefill")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert _deployment(objs, plan, "decode")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert _deployment(objs, plan, "decode")["spec"]["progressDeadlineSeconds"] == 90
    (warn,) = [p for p in plan.problems if p.rule == "in_place_update_surges"]
    assert warn.field == "spec.rollout.maxSurgeGPUs" and warn.severity == "warning"
    assert ("decode's in-place updates run without a surge pod: one needs 4 GPUs and rollout.maxSurgeGPUs (4) leaves 0 "
            "after prefill's surge pod") in warn.message
    assert "set rollout.maxSurgeGPUs to at least 8 (one budget for both roles' surge pods: prefill 4 + decode 4 GPUs)" in warn.fix


def test_prefill_readiness_covers_the_bootstrap_port_in_one_probe(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    prefill = _deployment(objs, plan, "prefill")["spec"]["template"]["spec"]["containers"][0]
    decode = _deployment(objs, plan, "decode")["spec"]["template"]["spec"]["containers"][0]
    probe = prefill["readinessProbe"]
    assert set(probe) == {"exec", "periodSeconds", "failureThreshold", "timeoutSeconds"}
    argv = probe["exec"]["command"]
    assert argv[:4] == ["python3", "-I", "-S", "-c"] and argv[5:] == ["127.0.0.1", "8998", "1", "30000", "5"]
    assert probe["timeoutSeconds"] > int(argv[-1])  # the script's own deadline ends first
    assert decode["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    for c in (prefill, decode):
        assert c["startupProbe"]["httpGet"]["path"] == c["livenessProbe"]["httpGet"]["path"] == "/health"


def test_a_compressed_option_sglang_ignores_changes_no_pod_template(catalog):
    from helpers import EXAMPLES, load_example

    doc = load_example(EXAMPLES / "dsv41-flash-h200-flashmla.yaml")
    plan, objs = _objs(doc, catalog)
    doc["spec"]["kvLayout"]["compressed"] = "fp4"  # H200: layout auto resolves to v4, which drops the option
    plan2, objs2 = _objs(doc, catalog)
    assert plan2.compat_key == plan.compat_key
    for role in ("prefill", "decode"):
        before, after = _deployment(objs, plan, role), _deployment(objs2, plan2, role)
        assert after["spec"]["template"] == before["spec"]["template"], role
        env = {e["name"]: e.get("value") for e in after["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["SGLANG_DSV4_COMPRESSED_KV_LAYOUT"] == "auto"
    assert any(p.rule == "kv_layout_overridden" and p.field == "spec.kvLayout.compressed" for p in plan2.problems)


def test_a_compressed_option_sglang_reads_still_rolls_the_pods(gb300_doc, catalog):
    plan, objs = _objs(gb300_doc, catalog)
    gb300_doc["spec"]["kvLayout"]["compressed"] = "fp8"  # GB300, V4.1 main: fp8 changes the c1/c2 caches
    plan2, objs2 = _objs(gb300_doc, catalog)
    assert plan2.compat_key != plan.compat_key  # the PD layout string changed: a new group
    env = {e["name"]: e.get("value") for e in _deployment(objs2, plan2, "decode")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SGLANG_DSV4_COMPRESSED_KV_LAYOUT"] == "fp8"


def test_every_object_and_pod_template_carries_the_label_the_operator_watches_by(catalog):
    """The operator watches its children with the server-side selector
    app.kubernetes.io/managed-by=sglang-pd-operator (docs/control-loop.md): an object or a pod
    without it would never reach the operator's view (and a group would look missing)."""
    from helpers import EXAMPLES, load_example

    managed = {"app.kubernetes.io/managed-by": L.MANAGED_BY}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        _, objs = _objs(load_example(path), catalog)
        for (kind, name), obj in objs.items():
            assert managed.items() <= obj["metadata"]["labels"].items(), (path.name, kind, name)
            template = obj.get("spec", {}).get("template")
            if template is not None:
                assert managed.items() <= template["metadata"]["labels"].items(), (path.name, kind, name)


def test_a_multi_node_role_without_replicas_gets_its_pdrolescales_count_in_its_leaderworkerset(catalog):
    """The count of a role spanning nodes is LeaderWorkerSet groups: the PDRoleScale's count, rendered."""
    from helpers import EXAMPLES

    from sglang_pd_operator.render import render_group

    doc = yaml.safe_load((EXAMPLES / "dsv41-flash-gb300-multi-node.yaml").read_text())
    doc["spec"]["decode"].pop("replicas", None)
    plan = build_plan(parse_pddeployment(doc), catalog)
    assert plan.valid and plan.decode.inputs.multi_node
    lws = next(o for o in render_group(plan, replicas={"decode": 3}) if o["kind"] == "LeaderWorkerSet"
               and o["metadata"]["name"].endswith("-decode"))
    assert lws["spec"]["replicas"] == 3
    assert "replicas" not in next(o for o in render_group(plan) if o["kind"] == "LeaderWorkerSet"
                                  and o["metadata"]["name"].endswith("-decode"))["spec"]
    _, objs = _objs(doc, catalog)
    assert objs[("PDRoleScale", f"{plan.name}-decode")]["spec"] == {"replicas": 1}
