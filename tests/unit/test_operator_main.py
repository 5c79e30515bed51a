"""The operator process: kopf logs in with the kubeconfig given on the command line."""

from __future__ import annotations

import os

from sglang_pd_operator import operator_main


def test_kopf_logs_in_with_the_kubeconfig_option(monkeypatch, tmp_path):
    """``run --kubeconfig X`` must not need ``KUBECONFIG=X`` too: kopf's login reads the
    environment, so run_operator points it at the option's file before kopf starts."""
    seen = {}

    async def fake_kopf_operator(**kwargs):
        seen["KUBECONFIG"] = os.environ.get("KUBECONFIG")

    monkeypatch.delenv("KUBECONFIG", raising=False)
    for name in ("RUNTIME", "RESYNC_SECONDS", "NAMESPACES", "SLO_INTERVAL", "METRICS"):  # restored after the test
        monkeypatch.setattr(operator_main.handlers, name, getattr(operator_main.handlers, name))
    monkeypatch.setattr(operator_main, "api_client_from_env", lambda path, timeouts=None: object())
    monkeypatch.setattr(operator_main, "Kube", lambda client, on_write=None: object())
    monkeypatch.setattr(operator_main, "ensure_crds", lambda **kwargs: None)
    monkeypatch.setattr(operator_main, "Runtime", lambda **kwargs: object())
    monkeypatch.setattr(operator_main.kopf, "operator", fake_kopf_operator)
    path = str(tmp_path / "kubeconfig")
    operator_main.run_operator(kubeconfig=path, namespaces=None, operator_namespace=None, resync=0,
                               metrics_port=0, liveness_port=0, slo_interval=0)
    assert seen == {"KUBECONFIG": path}


def test_every_kopf_request_and_watch_has_a_connect_and_an_overall_timeout():
    """kopf's defaults leave connect and watch-client timeouts unset (wait forever)."""
    from sglang_pd_operator.reconcilers.kube import ApiTimeouts

    settings = operator_main.kopf_settings(ApiTimeouts(connect=3, read=20))
    assert settings.scanning.disabled
    assert settings.networking.connect_timeout == 3 and settings.networking.request_timeout == 60
    assert settings.watching.connect_timeout == 3
    assert settings.watching.server_timeout < settings.watching.client_timeout < float("inf")
    assert settings.watching.inactivity_timeout <= 90  # a silent stream is replaced (kopf's bookmark watchdog)
