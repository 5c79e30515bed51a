"""The operator process: kopf logs in with the kubeconfig given on the command line."""

from __future__ import annotations

import os

from sglang_pd_operator.runtime import main as operator_main


def test_kopf_logs_in_with_the_kubeconfig_option(monkeypatch, tmp_path):
    """``run --kubeconfig X`` must not need ``KUBECONFIG=X`` too: kopf's login reads the
    environment, so run_operator points it at the option's file before kopf starts."""
    seen = {}

    async def fake_kopf_operator(**kwargs):
        seen["KUBECONFIG"] = os.environ.get("KUBECONFIG")
        seen["memo"] = kwargs.get("memo")

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr(operator_main, "api_client_from_env", lambda path, timeouts=None: object())
    monkeypatch.setattr(operator_main, "ensure_crds", lambda **kwargs: None)
    monkeypatch.setattr(operator_main.kopf, "operator", fake_kopf_operator)
    path = str(tmp_path / "kubeconfig")
    before = dict(vars(operator_main.kopf_glue))
    operator_main.run_operator(kubeconfig=path, namespaces=None, operator_namespace=None, resync=1,
                               metrics_port=0, liveness_port=0, slo_interval=0)
    assert seen["KUBECONFIG"] == path
    # configuration reaches the handlers through kopf's memo, never through module globals
    assert isinstance(seen["memo"].controller, operator_main.Controller)
    assert dict(vars(operator_main.kopf_glue)) == before


def test_child_kinds_are_watched_with_a_server_side_label_selector():
    """kopf asks the API server for the operator's children only: unrelated pods, Jobs and
    Deployments of the cluster never reach the process (issue 15, item 1)."""
    from kopf._cogs.structs.references import Resource

    from sglang_pd_operator.runtime.cache import WATCHED
    from sglang_pd_operator.reconcilers.kube import ApiTimeouts

    settings = operator_main.kopf_settings(ApiTimeouts())
    for watched in WATCHED:
        resource = Resource(group=watched.group, version=watched.version, plural=watched.plural,
                            kind=watched.kind, namespaced=True)
        got = settings.watching.label_selectors.collect(resource)
        if watched.kind in ("PDDeployment", "KernelBuild"):
            assert got == [], watched
        else:
            assert got == ["app.kubernetes.io/managed-by=sglang-pd-operator"], watched



def test_every_kopf_request_and_watch_has_a_connect_and_an_overall_timeout():
    """kopf's defaults leave connect and watch-client timeouts unset (wait forever)."""
    from sglang_pd_operator.reconcilers.kube import ApiTimeouts

    settings = operator_main.kopf_settings(ApiTimeouts(connect=3, read=20))
    assert settings.scanning.disabled
    assert settings.networking.connect_timeout == 3 and settings.networking.request_timeout == 60
    assert settings.watching.connect_timeout == 3
    assert settings.watching.server_timeout < settings.watching.client_timeout < float("inf")
    assert settings.watching.inactivity_timeout <= 90  # a silent stream is replaced (kopf's bookmark watchdog)


def test_kopf_keeps_no_diff_base_because_only_event_handlers_exist():
    """kopf's diff base (a deep copy of every event's object) serves create/update/resume
    handlers; the operator registers event handlers only, so it keeps none (NoDiffBase).
    A changing or spawning handler added to kopf_glue.py would need the real one back."""
    import kopf

    from sglang_pd_operator.reconcilers.kube import ApiTimeouts

    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers()
    assert not registry._changing.get_all_handlers() and not registry._spawning.get_all_handlers()
    storage = operator_main.kopf_settings(ApiTimeouts()).persistence.diffbase_storage
    assert isinstance(storage, operator_main.NoDiffBase)
    body = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": [1] * 1000}})
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None
