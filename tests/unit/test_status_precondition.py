"""Status writes carry a precondition (issue 29, item 3): a difference computed against one version of
the object never lands on another (a status another replica or a user rewrote meanwhile).

The API server's side (409 Conflict on a stale ``metadata.resourceVersion`` in a merge patch)
is Kubernetes' optimistic concurrency; here: what the operator sends.
"""

from __future__ import annotations

from sglang_pd_operator.reconcilers import pddeployment
from sglang_pd_operator.reconcilers.kube import Kube


class FakeDynamic:
    def __init__(self) -> None:
        self.patches: list[dict] = []

    def patch(self, resource, *, body, name, namespace, content_type, serializer=None):
        self.patches.append(body)
        return None


class FakeResource:
    subresources = {"status": "status"}


def kube() -> tuple[Kube, FakeDynamic]:
    k = Kube(api_client=None)  # type: ignore[arg-type]
    dyn = FakeDynamic()
    k._dynamic = dyn  # type: ignore[assignment]
    k._resource = lambda av, kind: FakeResource()  # type: ignore[method-assign]
    return k, dyn


def test_a_status_patch_with_a_resource_version_sends_it_as_a_precondition():
    k, dyn = kube()
    k.patch_status("pd.sglang-operator.io/v1alpha1", "PDDeployment", "d", "ns", {"phase": "x"}, resource_version="41")
    k.patch_status("pd.sglang-operator.io/v1alpha1", "PDDeployment", "d", "ns", {"phase": "y"})
    assert dyn.patches == [{"status": {"phase": "x"}, "metadata": {"resourceVersion": "41"}},
                           {"status": {"phase": "y"}}]


def test_the_pddeployment_status_write_is_computed_against_the_version_it_read():
    k, dyn = kube()
    body = {"metadata": {"name": "d", "namespace": "ns", "resourceVersion": "977"}}
    assert pddeployment._write_status(k, body, {"observedGeneration": 1}, {"observedGeneration": 2})
    assert dyn.patches == [{"status": {"observedGeneration": 2}, "metadata": {"resourceVersion": "977"}}]
    assert not pddeployment._write_status(k, body, {"observedGeneration": 2}, {"observedGeneration": 2})
