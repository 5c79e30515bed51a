"""The checked-in CRDs are generated from the API models and are structural."""

from __future__ import annotations

from sglang_pd_operator.api.crd import all_crds, render_yaml
from helpers import ROOT


def test_checked_in_crds_are_current():
    for name, crd in all_crds().items():
        path = ROOT / "crds" / name
        assert path.is_file(), f"{path} missing: run `sglang-pd-operator crds`"
        assert path.read_text() == render_yaml(crd), f"{path} is stale: run `sglang-pd-operator crds`"


def _walk(schema, path="spec"):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_documented():
    crd = all_crds()["pddeployments.yaml"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(spec):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "default", "title", "const"):
            assert banned not in node, f"{path} has {banned}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        if path != "spec" and not (path.endswith(("[]", "{}")) and node.get("type") != "object"):
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_printer_columns_and_short_name():
    crd = all_crds()["pddeployments.yaml"]
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Ready", "Valid", "Prefill", "Decode", "Pods", "KV Layout", "Age"]
    assert crd["spec"]["names"]["shortNames"] == ["pdd"]
    assert version["subresources"] == {"status": {}}


def test_the_readme_says_which_kind_kubectl_scale_works_on():
    """PDRoleScale serves /scale, PDDeployment does not (kubectl scale pdd answers NotFound,
    the API server's word): the README must say so and point to pdrs."""
    import yaml

    def scale(name: str):
        (version,) = [v for v in yaml.safe_load((ROOT / "crds" / name).read_text())["spec"]["versions"] if v.get("served")]
        return (version.get("subresources") or {}).get("scale")

    assert scale("pdrolescales.yaml") is not None and scale("pddeployments.yaml") is None
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`kubectl scale pdrs <name>-decode -n <namespace> --replicas=3`" in readme
    assert "`kubectl scale pdd …` answers NotFound" in readme
