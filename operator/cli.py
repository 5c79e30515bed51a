"""The command line: ``run`` the operator, ``check`` and ``render`` specs offline, write ``crds``; ``dev`` tools when installed.

``check`` and ``render`` need no cluster: they are what a GitOps pipeline runs before
merging. Exit codes of ``check``: 0 valid (warnings allowed), 1 any error (ours, or with
``--sglang`` SGLang's), 2 unreadable input, 3 ``--sglang`` gave no verdict (the oracle is
not installed, failed, or could not judge a spec the operator accepts).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import click
import yaml

from .api.load import load_documents, meant_as_pddeployment
from .catalog import CatalogError, load_catalog
from .planning.plan import plan_object
from .planning.structs import Plan
from .planning.problems import Problem, errors, warnings
from .render import render_all

EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE, EXIT_NO_VERDICT = 0, 1, 2, 3


def _queue_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--default-queue-name``: a Kueue LocalQueue name (a DNS label, like ``spec.scheduling.queueName``);
    empty means none."""
    import re

    from .api.v1alpha1 import DNS_LABEL_PATTERN

    if not value:
        return None
    if len(value) > 63 or not re.match(DNS_LABEL_PATTERN, value):
        raise click.BadParameter("expected a LocalQueue name: a DNS label (lower-case letters, digits and '-', "
                                 "at most 63), e.g. gb300")
    return value


#: ``run``, ``check`` and ``render`` take the same default queue, so that ``check`` in CI plans (compat key,
#: rendered labels) what the operator in the cluster will.
default_queue_option = click.option(
    "--default-queue-name", "default_queue", default=None, envvar="SGLANG_PD_DEFAULT_QUEUE_NAME",
    callback=_queue_name, metavar="LOCALQUEUE",
    help="Kueue LocalQueue for every PDDeployment that names none in spec.scheduling.queueName (the chart's "
         "scheduling.defaultQueueName): its multi-node replicas are admitted through it. It reaches groups "
         "created after it is set; a running group keeps its queue (UpgradePending). docs/multi-node.md.")


class Unreadable(Exception):
    """A file that cannot be read or is not YAML (exit code 2)."""


class CatalogUnreadable(click.ClickException):
    """The kernel catalog is missing or malformed: exit code 2, like unreadable input
    (exit 1 would read as "your spec has problems")."""

    exit_code = EXIT_UNREADABLE


def _catalog(catalog_dir: str | None):
    try:
        return load_catalog(Path(catalog_dir) if catalog_dir else None)
    except CatalogError as e:
        raise CatalogUnreadable(f"catalog: {e}") from e


def _read(path: str) -> list[dict[str, Any]]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        return load_documents(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise Unreadable(f"{path}: {e}") from e


def check_result(doc: dict[str, Any], plan: Plan | None, problems: list[Problem]) -> dict[str, Any]:
    """The JSON shape of ``check -o json`` for one document and its plan / problems.

    {"name", "namespace", "valid", "problems": [{field, message, severity, rule}],
     "roles": {"prefill"|"decode": {"args", "env", "kvLayout", "attentionBackend",
     "features", "memoryRequestBytes", "gpuMemoryOutsideKVBytes"}}, "compatKey"}
    """
    meta = doc.get("metadata") or {}
    out: dict[str, Any] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace", "default"),
        "valid": not errors(problems),
        "problems": [p.to_dict() for p in problems],
    }
    if plan is not None:
        out["roles"] = {
            r.role: {
                "args": list(r.command.args),
                "env": dict(r.command.env),
                "kvLayout": r.kv_layout_string,
                "attentionBackend": r.layout.attention_backend if r.layout else None,
                "features": sorted(r.features),
                "memoryRequestBytes": r.memory.host_bytes,
                "gpuMemoryOutsideKVBytes": r.memory.gpu_outside_kv_bytes,
            }
            for r in (plan.prefill, plan.decode)
        }
        out["compatKey"] = plan.compat_key
        if plan.queued:
            out["scheduling"] = {"queueName": plan.queue_name, "queueSource": plan.queue_source}
    return out


def _human(path: str, result: dict[str, Any], problems: list[Problem], *, sglang_refuses: bool = False) -> str:
    """``check``'s text for one document. ``sglang_refuses``: SGLang refused a spec the
    operator's rules find valid (``--sglang``), so the first line says both verdicts."""
    head = f"{path}: {result['namespace']}/{result['name'] or '<no name>'}"
    lines = []
    if result["valid"]:
        verdict = "valid by the operator's rules but SGLang refuses it" if sglang_refuses else "valid"
        head += f": {verdict}, compat key {result.get('compatKey')}"
        for role, r in result.get("roles", {}).items():
            layout = r["kvLayout"] or "n/a (not a DeepSeek-V4 model)"
            backend = f" via {r['attentionBackend']}" if r["attentionBackend"] else ""
            lines.append(f"  {role}: KV layout {layout}{backend}")
        if "scheduling" in result:
            q = result["scheduling"]
            lines.append(f"  Kueue queue {q['queueName']} ({'spec' if q['queueSource'] == 'spec' else 'operator default'})")
    else:
        head += f": refused, {len(errors(problems))} problem(s)"
    for p in errors(problems) + warnings(problems):
        lines.append(f"  {p.line()}")
    return "\n".join([head, *lines])


#: Entry-point group through which another installed distribution adds commands: the
#: repository's dev tools (devtools/, distribution sglang-pd-operator-dev) add ``dev``. The
#: operator never imports them by name (tests/unit/test_layers.py), and its image has none.
PLUGIN_GROUP = "sglang_pd_operator.cli"
#: What ``dev`` says when the dev tools are not installed.
DEV_MISSING = (
    "the `dev` commands (dev cluster, dev demo) come with the repository's dev tools "
    "(distribution sglang-pd-operator-dev), which are not installed here: in a checkout run "
    "./hack/setup.sh, or pip install -e ./devtools"
)


def _plugins() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=PLUGIN_GROUP))


class _Commands(click.Group):
    """The command group; a name it does not hold is looked up among the installed plugins
    (:data:`PLUGIN_GROUP`), loaded only when run, so ``check`` never imports them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *(ep.name for ep in _plugins()), "dev"})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        for ep in _plugins():
            if ep.name == name:
                return ep.load()
        return _dev_missing if name == "dev" else None


@click.command("dev", add_help_option=False, short_help="Dev tools (not installed here).",
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def _dev_missing() -> None:
    """The dev tools are not installed: say how to install them (exit 1)."""
    raise click.ClickException(DEV_MISSING)


@click.group(cls=_Commands)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """sglang-pd-operator: SGLang prefill/decode disaggregation on Kubernetes."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
@click.option("--catalog-dir", default=None, help="Catalog folder (default: kernels/).")
@click.option("--sglang", "with_sglang", is_flag=True,
              help="Also run SGLang 0.5.23's own startup validation and PD handshake on each role "
                   "(needs `sglang-pd-operator sglang install`; no GPU).")
@click.option("--sglang-python", default=None, metavar="PYTHON",
              help="Interpreter that has sglang 0.5.23 installed (default: this one).")
@default_queue_option
def check(files: tuple[str, ...], output: str, catalog_dir: str | None, with_sglang: bool,
          sglang_python: str | None, default_queue: str | None) -> None:
    """Check PDDeployment FILES ('-' for stdin): exit 0 valid, 1 problems, 2 unreadable, 3 no SGLang verdict.

    Other objects in the files (Namespaces, PVCs, KernelBuilds) are skipped with a note on
    stderr. With -o json: one object when one file holds one PDDeployment (or cannot be
    read), else a list; an unreadable file is an entry with ``unreadable: true``. With
    --sglang each entry gains ``sglang``: SGLang's verdict per role and for the pair.
    With --default-queue-name (the operator's flag) each spec is planned as the operator
    with that flag plans it: the queue of its multi-node replicas and their compat key.
    """
    catalog = _catalog(catalog_dir)
    oracle, no_oracle = _start_oracle(catalog, sglang_python) if with_sglang else (None, None)
    results, code, texts, found = [], EXIT_VALID, [], False
    try:
        for path in files:
            try:
                docs = _read(path)
            except Unreadable as e:
                click.echo(f"error: {e}", err=True)
                code = EXIT_UNREADABLE
                results.append(_unreadable_result(path, str(e)))
                continue
            for doc in _pddeployments(path, docs):
                found = True
                plan, problems = plan_object(doc, catalog, default_queue=default_queue)
                result = check_result(doc, plan, problems)
                result["file"] = path
                text = _human(path, result, problems)
                if with_sglang and plan is not None:
                    if oracle is not None:
                        verdict, text_sglang, verdict_code = _sglang_verdict(oracle, plan, result["valid"])
                    else:
                        verdict, text_sglang = {"accepted": None, "error": no_oracle}, f"  SGLang 0.5.23: no verdict: {no_oracle}"
                        verdict_code = EXIT_NO_VERDICT if result["valid"] else EXIT_VALID
                    result["sglang"] = verdict
                    text = _human(path, result, problems, sglang_refuses=verdict.get("accepted") is False)
                    text += "\n" + text_sglang
                    code = _worse(code, verdict_code)
                results.append(result)
                if not result["valid"]:
                    code = _worse(code, EXIT_INVALID)
                texts.append(text)
    finally:
        if oracle is not None:
            oracle.close()
    if not found and code == EXIT_VALID:
        click.echo("error: no PDDeployment in the input", err=True)
        code = EXIT_UNREADABLE
    if output == "json":
        click.echo(json.dumps(results[0] if len(files) == 1 and len(results) == 1 else results, indent=2))
    elif texts:
        click.echo("\n".join(texts))
    sys.exit(code)


def _worse(code: int, other: int) -> int:
    """The exit code that wins: unreadable (2) over problems (1) over no verdict (3) over valid (0)."""
    order = {EXIT_VALID: 0, EXIT_NO_VERDICT: 1, EXIT_INVALID: 2, EXIT_UNREADABLE: 3}
    return code if order[code] >= order[other] else other


def _start_oracle(catalog, python: str | None):
    """(the SGLang oracle, None), or (None, why it cannot run) after a warning on stderr.

    Without the oracle ``check --sglang`` still gives the operator's own verdict; each
    entry's ``sglang`` says why SGLang's is missing, and the exit code is 3 only for
    specs the operator itself finds valid (see ``_sglang_verdict``).
    """
    from .oracle import Oracle, unavailable

    why = unavailable(python)
    if why is not None:
        click.echo(f"warning: --sglang: {why}", err=True)
        return None, why
    return Oracle(catalog=catalog, python=python), None


def _sglang_verdict(oracle, plan: Plan, ours_valid: bool) -> tuple[dict[str, Any], str, int]:
    """(JSON verdict, text lines, exit code) of SGLang's judgement of ``plan``."""
    import time

    from .oracle import OracleError

    t0 = time.monotonic()
    try:
        verdict = oracle.judge_plan(plan)
    except OracleError as e:
        first = str(e).splitlines()[0]
        code = EXIT_NO_VERDICT if ours_valid else EXIT_VALID
        return {"accepted": None, "error": str(e)}, f"  SGLang 0.5.23: no verdict: {first}", code
    seconds = time.monotonic() - t0
    data = verdict.to_dict()
    data["seconds"] = round(seconds, 3)
    head = {True: "starts and pairs", False: "refused", None: "no verdict"}[verdict.accepted]
    lines = [f"  SGLang 0.5.23: {head} ({seconds:.1f} s)"]
    for rv in (verdict.prefill, verdict.decode):
        if rv.starts:
            facts = rv.facts or {}
            layout = f", KV layout {facts['kvLayout']}" if facts.get("kvLayout") else ""
            memory = facts.get("memory") or {}
            weights = (facts.get("model") or {}).get("weightBytes")
            sized = (f", weights {weights / (1 << 30):.1f} GiB/GPU, KV {memory['maxTotalNumTokens']} tokens"
                     if weights is not None and memory.get("maxTotalNumTokens") else "")
            state = f"starts (attention TP {facts.get('attnTpSize')}, page {facts.get('pageSize')}{layout}{sized})"
        elif rv.starts is False and rv.refusal is not None:
            state = f"refused at {rv.refusal.phase or rv.refusal.stage} ({rv.refusal.stage}): {rv.refusal.line()}"
        else:
            state = f"no verdict: {rv.indeterminate}"
        lines.append(f"    {rv.role} on {rv.accelerator}: {state}")
    pair = verdict.pair
    if pair.pairs:
        lines.append("    pair: the PD handshake passes")
    elif pair.pairs is False and pair.refusal is not None:
        lines.append(f"    pair: refused at {pair.refusal.stage}: {pair.refusal.line()}")
    else:
        lines.append(f"    pair: not tried: {pair.indeterminate}")
    for note in verdict.assumptions:
        lines.append(f"    assumes: {note}")
    # the startup steps that did not run (the same for both roles unless a stand-in was used)
    for note in dict.fromkeys(n for rv in (verdict.prefill, verdict.decode) for n in rv.assumes):
        lines.append(f"    assumes: {note}")
    if verdict.accepted is False:
        return data, "\n".join(lines), EXIT_INVALID
    if verdict.accepted is None and ours_valid:
        return data, "\n".join(lines), EXIT_NO_VERDICT
    return data, "\n".join(lines), EXIT_VALID


def _pddeployments(path: str, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PDDeployments among ``docs`` (read from ``path``); a note on stderr for each other object skipped."""
    out = []
    for doc in docs:
        if meant_as_pddeployment(doc):
            out.append(doc)
            continue
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        click.echo(f"note: {path}: skipped {doc.get('apiVersion')} {doc.get('kind')} {meta.get('name')}: "
                   "not a PDDeployment", err=True)
    return out


def _unreadable_result(path: str, error: str) -> dict[str, Any]:
    """The ``check -o json`` entry of a file that cannot be read or parsed."""
    problem = {"field": "", "message": error, "severity": "error", "rule": "unreadable"}
    return {"file": path, "valid": False, "unreadable": True, "problems": [problem]}


@main.command()
@click.argument("files", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml")
@click.option("--catalog-dir", default=None, help="Catalog folder (default: kernels/).")
@default_queue_option
def render(files: tuple[str, ...], output: str, catalog_dir: str | None, default_queue: str | None) -> None:
    """Print the child objects the operator would create for FILES (no cluster needed).

    Problems go to stderr (warnings too); other objects are skipped with a note. Exit 0,
    1 when a PDDeployment is refused, 2 when a file is unreadable or holds no PDDeployment.
    """
    catalog = _catalog(catalog_dir)
    objects: list[dict[str, Any]] = []
    failed = found = False
    for path in files:
        try:
            docs = _read(path)
        except Unreadable as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_UNREADABLE)
        for doc in _pddeployments(path, docs):
            found = True
            plan, problems = plan_object(doc, catalog, default_queue=default_queue)
            for p in warnings(problems):
                click.echo(f"{path}: {p.line()}", err=True)  # line() says "warning:" itself
            if plan is None or not plan.valid:
                failed = True
                for p in errors(problems):
                    click.echo(f"{path}: {p.line()}", err=True)
                continue
            objects += render_all(plan)
    if not found:
        click.echo("error: no PDDeployment in the input", err=True)
        sys.exit(EXIT_UNREADABLE)
    if output == "json":
        click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    else:
        click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)
    sys.exit(EXIT_INVALID if failed else EXIT_VALID)


@main.command()
@click.option("--out-dir", default=None,
              help="Folder to write into, policies into its policies/ (default: crds/ and the chart's files/crds/, files/policies/).")
@click.option("--check", "check_only", is_flag=True, help="Exit 1 when the files differ from the models.")
def crds(out_dir: str | None, check_only: bool) -> None:
    """Write crds/*.yaml and crds/policies/*.yaml (and the Helm chart's copies) from the API models, or --check that they are current.

    The policies: the MutatingAdmissionPolicy and binding that give each replica its own IMEX
    channel (api/computedomain.py ``admission_policy``), installed by the chart or with ``kubectl apply -f crds/policies/``.
    """
    from .api.computedomain import admission_policy
    from .api.crd import all_crds, render_yaml

    repo = Path(__file__).resolve().parent.parent
    chart = repo / "charts" / "sglang-pd-operator" / "files"
    directories = ([(Path(out_dir), Path(out_dir) / "policies")] if out_dir
                   else [(repo / "crds", repo / "crds" / "policies"), (chart / "crds", chart / "policies")])
    policy, binding = admission_policy()
    policies = {"imex-channel-per-replica-policy.yaml": policy, "imex-channel-per-replica-binding.yaml": binding}
    stale = []
    for crd_dir, policy_dir in directories:
        for directory, name, crd in [*((crd_dir, n, c) for n, c in all_crds().items()),
                                     *((policy_dir, n, o) for n, o in policies.items())]:
            path = directory / name
            text = render_yaml(crd)
            if check_only:
                if not path.is_file() or path.read_text() != text:
                    stale.append(str(path))
            else:
                directory.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                click.echo(path)
    if stale:
        click.echo(f"stale: {', '.join(stale)}; run `sglang-pd-operator crds`", err=True)
        sys.exit(1)


@main.command()
@click.option("--kubeconfig", default=None, envvar="KUBECONFIG", help="Kubeconfig (default: in-cluster).")
@click.option("--namespace", "namespaces", multiple=True, help="Watch only these namespaces (repeatable).")
@click.option("--operator-namespace", envvar="POD_NAMESPACE", default=None, help="Where the catalog ConfigMap and the leader Lease live.")
@click.option("--resync", default=300.0, show_default=True,
              help="Seconds in which every PDDeployment and KernelBuild is reconciled once, each at its own offset "
                   "(watch events, rollout deadlines and SLO changes trigger reconciles without waiting for it).")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Reconcile worker threads (one object is never reconciled by two at once).")
@click.option("--slo-status-period", default=60.0, show_default=True,
              help="Least seconds between two status writes of a PDDeployment that only move SLO figures "
                   "(a condition that changes is written at once).")
@click.option("--metrics-port", default=8080, show_default=True, help="Port of /metrics (0: off).")
@click.option("--liveness-port", default=0, show_default=True,
              help="Port of kopf's own /healthz (0: off). The liveness endpoint is /healthz on --metrics-port: "
                   "it also fails when the resync loop, a reconcile or the SLO scraper is stuck.")
@click.option("--crds", "crd_policy", type=click.Choice(["check", "apply", "skip"]), default="check", show_default=True,
              help="At start: refuse to run when our CRDs are missing or older than this operator (check); "
                   "server-side apply them first when missing or older (apply); no CRD access (skip).")
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True,
              help="Reconcile only while holding a coordination.k8s.io Lease, so that two operator processes on "
                   "one cluster never both reconcile. --no-leader-elect: only for a single process you know is "
                   "alone (it refuses to start while another process holds the Lease).")
@click.option("--leader-elect-lease", default="sglang-pd-operator", show_default=True,
              help="Name of the Lease, in --operator-namespace (default: the pod's namespace, else the "
                   "kubeconfig context's, else 'default').")
@click.option("--leader-elect-timing", default="15,10,2", show_default=True, metavar="LEASE,RENEW,RETRY",
              help="Lease duration, renew deadline and retry period, whole seconds.")
@click.option("--api-timeout", default="5,30", show_default=True, metavar="CONNECT,READ",
              help="Seconds to wait for a connection to the API server and for each read of an answer, "
                   "on every API call.")
@click.option("--stuck-after", default=180.0, show_default=True,
              help="Seconds after which a reconcile, the resync loop or the SLO scraper counts as stuck: "
                   "/healthz answers 503 (the liveness probe restarts the pod).")
@click.option("--slo-interval", default=15.0, show_default=True,
              help="Seconds between scrapes of the engine and gateway pods' /metrics (SLOs, health; 0: off).")
@click.option("--slo-source", type=click.Choice(["scrape", "prometheus"]), default="scrape", show_default=True,
              help="Where the SLO figures come from: the operator scrapes every engine pod itself (scrape), or it "
                   "asks the cluster's Prometheus one batched set of PromQL queries per --slo-interval "
                   "(prometheus; needs --prometheus-url and the PodMonitor the operator renders). docs/slo.md.")
@click.option("--prometheus-url", default=None, envvar="SGLANG_PD_PROMETHEUS_URL",
              help="Base URL of Prometheus' HTTP API for --slo-source prometheus, e.g. "
                   "http://prometheus-operated.monitoring:9090.")
@click.option("--prometheus-bearer-token-file", default=None, type=click.Path(dir_okay=False),
              help="File holding a bearer token for Prometheus (re-read every interval).")
@click.option("--prometheus-ca-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="CA bundle to verify an https Prometheus URL.")
@click.option("--prometheus-cert-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Client certificate for Prometheus (mutual TLS).")
@click.option("--prometheus-key-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Key of --prometheus-cert-file.")
@click.option("--prometheus-insecure-skip-verify", is_flag=True, default=False,
              help="Do not verify Prometheus' TLS certificate (test setups only).")
@click.option("--oracle-url", default=None, envvar="SGLANG_PD_ORACLE_URL",
              help="The SGLang oracle service (`oracle serve`, the chart's oracle.enabled), e.g. "
                   "http://sglang-pd-operator-oracle:8090: every new generation whose rules pass waits for SGLang's "
                   "verdict before a child is created or changed. Unset: the operator's rules alone.")
@click.option("--oracle-on-unavailable", type=click.Choice(["wait", "rulesOnly"]), default="wait", show_default=True,
              help="Default of spec.oracle.onUnavailable: after --oracle-max-wait without a verdict, keep waiting "
                   "(Valid False, SGLangUnavailable) or go on with the rules alone (Valid True, RulesOnly, a Warning).")
@click.option("--oracle-max-wait", default="5m", show_default=True, metavar="DURATION",
              help="Default of spec.oracle.maxWait: how long a generation waits for SGLang's verdict.")
@default_queue_option
def run(
    kubeconfig: str | None,
    namespaces: tuple[str, ...],
    operator_namespace: str | None,
    resync: float,
    metrics_port: int,
    liveness_port: int,
    crd_policy: str,
    leader_elect: bool,
    leader_elect_lease: str,
    leader_elect_timing: str,
    api_timeout: str,
    stuck_after: float,
    slo_interval: float,
    workers: int,
    slo_status_period: float,
    slo_source: str,
    prometheus_url: str | None,
    prometheus_bearer_token_file: str | None,
    prometheus_ca_file: str | None,
    prometheus_cert_file: str | None,
    prometheus_key_file: str | None,
    prometheus_insecure_skip_verify: bool,
    oracle_url: str | None,
    oracle_on_unavailable: str,
    oracle_max_wait: str,
    default_queue: str | None,
) -> None:
    """Run the operator (kopf) until interrupted; exits 1 when the CRDs are missing or older, 3 on lost leadership.

    Exits 2 with --no-leader-elect while another process holds the Lease.
    """
    from .runtime.leader import AnotherLeader, LeaderSettings, default_identity, default_lease_namespace
    from .runtime.main import run_operator
    from .reconcilers.crds import CRDCheckUnreachable, CRDSchemaError
    from .reconcilers.kube import ApiTimeouts

    try:
        connect, read = (float(x) for x in api_timeout.split(","))
    except ValueError:
        raise click.BadParameter("expected two numbers of seconds, e.g. 5,30", param_hint="--api-timeout") from None
    if not (connect > 0 and read > 0):
        raise click.BadParameter("both timeouts must be > 0", param_hint="--api-timeout")
    if stuck_after <= 0:
        raise click.BadParameter("must be > 0", param_hint="--stuck-after")
    if resync <= 0:
        raise click.BadParameter("must be > 0", param_hint="--resync")
    if slo_status_period < 0:
        raise click.BadParameter("must be >= 0", param_hint="--slo-status-period")
    prometheus = None
    if slo_source == "prometheus":
        from .metrics.prometheus_source import PrometheusSettings

        if not prometheus_url:
            raise click.BadParameter("--slo-source prometheus needs the URL of Prometheus' HTTP API, e.g. "
                                     "--prometheus-url http://prometheus-operated.monitoring:9090",
                                     param_hint="--prometheus-url")
        try:
            prometheus = PrometheusSettings(url=prometheus_url, bearer_token_file=prometheus_bearer_token_file,
                                            ca_file=prometheus_ca_file, cert_file=prometheus_cert_file,
                                            key_file=prometheus_key_file,
                                            insecure_skip_verify=prometheus_insecure_skip_verify)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--prometheus-url") from None
    from .api.v1alpha1 import parse_duration

    try:
        oracle_wait_s = parse_duration(oracle_max_wait)
    except ValueError:
        raise click.BadParameter("expected a duration such as 90s or 5m", param_hint="--oracle-max-wait") from None
    if oracle_url is not None and not oracle_url.startswith(("http://", "https://")):
        raise click.BadParameter("expected an http(s) URL, e.g. http://sglang-pd-operator-oracle:8090",
                                 param_hint="--oracle-url")
    try:
        lease, renew, retry = (int(x) for x in leader_elect_timing.split(","))
    except ValueError:
        raise click.BadParameter("expected three whole numbers of seconds, e.g. 15,10,2",
                                 param_hint="--leader-elect-timing") from None
    if not lease > renew > 1.2 * retry >= 1.2:
        raise click.BadParameter("need LEASE > RENEW > 1.2 * RETRY >= 1.2", param_hint="--leader-elect-timing")
    log = logging.getLogger("sglang_pd_operator")
    lease_namespace = operator_namespace
    if not lease_namespace:
        lease_namespace, why = default_lease_namespace(kubeconfig_namespace=_kubeconfig_namespace(kubeconfig))
        log.info("leader lease in namespace %s (%s; set --operator-namespace to choose)", lease_namespace, why)
    settings = LeaderSettings(lease_name=leader_elect_lease, namespace=lease_namespace, identity=default_identity(),
                              lease_duration=lease, renew_deadline=renew, retry_period=retry)
    try:
        run_operator(
            kubeconfig=kubeconfig,
            namespaces=list(namespaces) or None,
            operator_namespace=operator_namespace,
            resync=resync,
            metrics_port=metrics_port,
            liveness_port=liveness_port,
            crd_policy=crd_policy,
            leader=settings if leader_elect else None,
            unelected_lease=None if leader_elect else settings,
            slo_interval=slo_interval,
            timeouts=ApiTimeouts(connect=connect, read=read),
            stuck_after=stuck_after,
            workers=workers,
            slo_status_period=slo_status_period,
            slo_source=slo_source,
            prometheus=prometheus,
            oracle_url=oracle_url,
            oracle_policy=oracle_on_unavailable,
            oracle_max_wait_s=oracle_wait_s,
            default_queue=default_queue,
        )
    except (CRDSchemaError, CRDCheckUnreachable) as e:
        log.error("refusing to run: %s", e)
        sys.exit(1)
    except AnotherLeader as e:
        log.error("refusing to run: %s", e)
        sys.exit(EXIT_UNREADABLE)


def _kubeconfig_namespace(kubeconfig: str | None) -> str | None:
    """The namespace of the kubeconfig's current context, None when there is none (or no kubeconfig)."""
    from kubernetes import config as k8s_config

    try:
        _, current = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception:  # noqa: BLE001 - in a pod there is no kubeconfig
        return None
    return ((current or {}).get("context") or {}).get("namespace")


@main.group()
def sglang() -> None:
    """The SGLang oracle behind ``check --sglang``: install it, or see whether it works here."""


@sglang.command("install")
@click.option("--python", "python", default=None, metavar="PYTHON",
              help="Interpreter to install into (default: this one).")
def sglang_install(python: str | None) -> None:
    """Install sglang 0.5.23 for the oracle, CPU only (no CUDA wheels; needs cc and readelf).

    About 2 minutes and 3 GiB on a fresh environment; see README, "SGLang's own verdict".
    """
    import subprocess

    from .oracle import unavailable
    from .oracle.install import install

    try:
        timings = install(python, echo=click.echo)
    except subprocess.CalledProcessError as e:
        raise click.ClickException(f"step failed (exit {e.returncode}): {' '.join(e.cmd)}") from e
    why = unavailable(python, thorough=True)
    if why is not None:
        raise click.ClickException(f"installed, but the oracle cannot run: {why}")
    click.echo(f"sglang install: done in {sum(t for _, t in timings):.0f} s; `check --sglang` is ready")


@sglang.command("status")
@click.option("--python", "python", default=None, metavar="PYTHON", help="Interpreter with sglang (default: this one).")
def sglang_status(python: str | None) -> None:
    """Exit 0 when ``check --sglang`` can run with PYTHON, 3 (and why) when not."""
    from .oracle import unavailable

    why = unavailable(python, thorough=True)
    if why is not None:
        click.echo(why, err=True)
        sys.exit(EXIT_NO_VERDICT)
    click.echo("the SGLang 0.5.23 oracle is ready")


@main.group("oracle")
def oracle_group() -> None:
    """The SGLang oracle as a service the operator consults (``run --oracle-url``)."""


@oracle_group.command("serve")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8090, show_default=True, type=int, help="HTTP port.")
@click.option("--warm", default="gb300", show_default=True, metavar="ACC[,ACC]",
              help="Accelerators whose workers start at once (/readyz waits for them); others start on first use.")
@click.option("--judges", default=2, show_default=True, type=int, help="Specs judged at once.")
@click.option("--queue-size", default=64, show_default=True, type=int,
              help="Specs waiting for a judge; beyond it a request is answered 503.")
@click.option("--request-timeout", default=120.0, show_default=True, type=float,
              help="Seconds a request may take, queue included (504 after; a worker that hangs is restarted).")
@click.option("--max-body-bytes", default=1 << 20, show_default=True, type=int, help="Largest request body.")
@click.option("--max-workers", default=4, show_default=True, type=int,
              help="Accelerator workers kept (each holds SGLang imported, ~0.5 GiB); the least recently used goes.")
@click.option("--catalog-dir", default=None, help="Catalog folder (default: the built-in kernels/).")
@click.option("--sglang-python", default=None, metavar="PYTHON", help="Interpreter with sglang 0.5.23 (default: this one).")
def oracle_serve(host: str, port: int, warm: str, judges: int, queue_size: int, request_timeout: float,
                 max_body_bytes: int, max_workers: int, catalog_dir: str | None, sglang_python: str | None) -> None:
    """Serve SGLang's verdict over HTTP: POST /v1/verdict, GET /healthz, /readyz, /stats.

    The answer's ``sglang`` is the verdict of ``check --sglang -o json``. Exits 3 when
    sglang 0.5.23 cannot run here (``sglang-pd-operator sglang install``).
    """
    import signal

    from .oracle import unavailable
    from .oracle.service import OracleHTTPServer, VerdictService

    why = unavailable(sglang_python)
    if why is not None:
        click.echo(f"error: oracle serve: {why}", err=True)
        sys.exit(EXIT_NO_VERDICT)
    catalog = _catalog(catalog_dir)
    accelerators = tuple(a for a in warm.split(",") if a)
    unknown = [a for a in accelerators if catalog.accelerator(a) is None]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)} not in the catalog ({', '.join(sorted(catalog.accelerators))})",
                                 param_hint="--warm")
    service = VerdictService(catalog=catalog, warm=accelerators, judges=judges, queue_size=queue_size,
                             request_timeout_s=request_timeout, python=sglang_python, max_workers=max_workers)
    server = OracleHTTPServer((host, port), service, max_body_bytes=max_body_bytes)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    service.start()
    click.echo(f"oracle serving on http://{host}:{server.server_address[1]} (warming {', '.join(accelerators) or 'nothing'})",
               err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        service.close()


if __name__ == "__main__":  # pragma: no cover
    main()
