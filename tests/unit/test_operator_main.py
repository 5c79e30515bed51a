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
    monkeypatch.setattr(operator_main, "api_client_from_env", lambda path, timeouts=None, pool_maxsize=None: object())
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


def test_child_kinds_are_watched_with_a_server_side_label_selector_and_bookmarks():
    """The reflectors ask the API server for the operator's children only: unrelated pods, Jobs
    and Deployments of the cluster never reach the process (issue 15, item 1); every watch
    asks for bookmarks and resumes from the version it was given."""
    from sglang_pd_operator.runtime.cache import WATCHED, ObjectCache
    from sglang_pd_operator.runtime.informer import Reflector

    class Resource:
        def path(self, namespace=None):
            return "/apis/x" if namespace is None else f"/apis/x/ns/{namespace}"

    class Client:
        def param_serialize(self, method, path, query_params, **_):
            self.query = dict(query_params)
            raise StopIteration  # enough: the request is built

    class FakeKube:
        api_client = Client()

        def _resource(self, av, kind):
            return Resource()

    for watched in WATCHED:
        r = Reflector(watched, None, kube=FakeKube(), cache=ObjectCache(), on_listed=None, on_event=None)
        try:
            r._request(resource_version="42", timeout_seconds=300)
        except StopIteration:
            pass
        q = FakeKube.api_client.query
        assert q["watch"] == "true" and q["allowWatchBookmarks"] == "true" and q["resourceVersion"] == "42"
        if watched.kind in ("PDDeployment", "KernelBuild"):
            assert "labelSelector" not in q, watched
        else:
            assert q["labelSelector"] == "app.kubernetes.io/managed-by=sglang-pd-operator", watched


def test_every_kopf_request_has_a_connect_and_an_overall_timeout():
    """kopf's defaults leave connect and watch-client timeouts unset (wait forever)."""
    from sglang_pd_operator.reconcilers.kube import ApiTimeouts

    settings = operator_main.kopf_settings(ApiTimeouts(connect=3, read=20))
    assert settings.scanning.disabled
    assert settings.networking.connect_timeout == 3 and settings.networking.request_timeout == 60
    assert settings.watching.connect_timeout == 3
    assert settings.watching.server_timeout < settings.watching.client_timeout < float("inf")


def test_kopf_watches_nothing_and_has_no_changing_handler():
    """The loop's reflectors watch (``informer.py``); kopf only hosts the process. A changing or
    spawning handler would make kopf add finalizers and annotations to the user's object, and
    a watching one would LIST and watch a kind a second time."""
    import kopf

    registry = kopf.get_default_registry()
    assert not registry._watching.get_all_handlers()
    assert not registry._changing.get_all_handlers() and not registry._spawning.get_all_handlers()
    assert registry._activities.get_all_handlers()  # startup and cleanup
