"""``dev cluster up|down|status|build``: the dev cluster from the command line.

The main CLI mounts the ``dev`` group (``sglang-pd-operator dev cluster up``);
``python -m sglang_pd_operator_dev.cluster up`` runs the ``cluster`` group directly.
``up`` stays in the foreground until Ctrl-C (then stops everything) unless ``--detach``;
``down`` stops a detached run through its state file.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from sglang_pd_operator_dev.cluster import build, gomod, paths, supervise, teardown
from sglang_pd_operator_dev.cluster.cluster import ClusterError, start_cluster


def _echo(message: str) -> None:
    click.echo(message)
    sys.stdout.flush()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    """A foreground cluster stops on Ctrl-C (SIGINT) and on SIGTERM: both unwind as KeyboardInterrupt.

    SIGINT is set explicitly: a process started in the background by a non-interactive
    shell (`cmd &` in a script, as a CI runner may) inherits SIGINT ignored, and Python then
    installs no handler of its own, so a SIGINT would be lost.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)


_run_dir_option = click.option(
    "--run-dir", type=click.Path(file_okay=False, path_type=Path),
    default=None, help="Run directory (default: <checkout>/.run/cluster).")


@click.group()
def dev() -> None:
    """Development tools."""


@dev.group()
def cluster() -> None:
    """A local control plane (etcd, kube-apiserver, controller manager, scheduler, kwok)
    with fake GPU nodes, built from the Kubernetes Go modules."""


@cluster.command("build")
@click.option("--kueue", "with_kueue", is_flag=True,
              help="Also build (or find) Kueue's controller, an optional component with its own cache.")
def build_cmd(with_kueue: bool) -> None:
    """Build (or find in the cache) the eight binaries (control plane and LWS controller)."""
    try:
        built = [build.ensure_binaries(log=_echo)]
        if with_kueue:
            built.append(build.ensure_kueue(log=_echo))
    except (build.BuildError, gomod.GoModuleDownloadError, gomod.GoToolMissing) as err:
        raise click.ClickException(str(err)) from err
    for bins in built:
        if bins.build_seconds is not None:
            _echo(f"build took {bins.build_seconds:.0f}s ({bins.packages_compiled} packages compiled; "
                  f"0 means Go's build cache was warm and only linking ran)")
        _echo(str(bins.dir))


@cluster.command()
@_run_dir_option
@click.option("--detach", is_flag=True, help="Return once ready; stop later with `down`.")
@click.option("--no-lws", is_flag=True,
              help="Leave the LeaderWorkerSet controller, its CRDs and webhooks out.")
@click.option("--oracle/--no-oracle", default=True, show_default=True,
              help="Run the SGLang oracle service (`oracle serve` from this venv) with the cluster, so an operator "
                   "started with the printed SGLANG_PD_ORACLE_URL gets Valid from SGLang's own verdict "
                   "(without sglang 0.5.23 in this venv it says why and the cluster comes up without it).")
@click.option("--oracle-warm", default="gb300", show_default=True, metavar="ACC[,ACC]",
              help="Accelerators whose oracle workers start at once (others start on their first spec).")
@click.option("--kueue", "with_kueue", is_flag=True,
              help="Also run Kueue (gang admission of LeaderWorkerSet groups; built on first use).")
def up(run_dir: Path | None, detach: bool, no_lws: bool, oracle: bool, oracle_warm: str, with_kueue: bool) -> None:
    """Start the cluster (and the SGLang oracle service); print the `export KUBECONFIG=...`,
    `export PATH=...` and `export SGLANG_PD_ORACLE_URL=...` lines to use it."""
    run_dir = run_dir or paths.default_run_dir()
    if not detach:
        _stop_on_signals()
    try:
        running = start_cluster(run_dir=run_dir, detach=detach, log=_echo, lws=not no_lws, oracle=oracle,
                                oracle_warm=tuple(a for a in oracle_warm.split(",") if a), kueue_queue=with_kueue)
    except (ClusterError, build.BuildError, gomod.GoModuleDownloadError,
            gomod.GoToolMissing) as err:
        raise click.ClickException(str(err)) from err
    except KeyboardInterrupt:
        raise click.Abort() from None
    for line in running.shell_exports():  # paste these to use the built kubectl and helm
        _echo(line)
    if detach:
        _echo(f"detached; stop it with: {Path(sys.executable).parent / 'sglang-pd-operator'} dev cluster down "
              f"--run-dir {running.run_dir}")
        return
    _echo("running; press Ctrl-C to stop")
    try:
        code = supervise.wait_until_interrupted(running, log=_echo)
    finally:
        running.stop(log=_echo)
    sys.exit(code)


@cluster.command()
@_run_dir_option
def down(run_dir: Path | None) -> None:
    """Stop the cluster recorded in the run directory (only processes it started)."""
    run_dir = run_dir or paths.default_run_dir()
    stopped = teardown.stop_run(run_dir, log=_echo)
    if not stopped:
        _echo(f"nothing running in {run_dir}")


@cluster.command()
@_run_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(run_dir: Path | None, as_json: bool) -> None:
    """Show the run's processes, /readyz and node readiness. Exit 1 when not running."""
    run_dir = run_dir or paths.default_run_dir()
    info = supervise.run_status(run_dir)
    if as_json:
        _echo(json.dumps(info, indent=2))
    else:
        _echo(f"run dir:    {info['run_dir']}")
        _echo(f"phase:      {info['phase']}"
              + (f" (stale: {info['stale_because']})"
                 if info.get("stale_because") and info["phase"] != "stopped" else ""))
        for key in ("kubeconfig", "server", "pod_network", "readyz", "oracle"):
            if info.get(key):
                _echo(f"{key + ':':<11} {info[key]}")
        if "nodes" in info:
            _echo(f"nodes:      {info['nodes']['ready']}/{info['nodes']['total']} Ready")
        if "lws" in info:
            lws = info["lws"]
            serving = "serving" if lws.get("serving") else "NOT serving"
            _echo(f"lws:        LeaderWorkerSet controller {lws.get('version') or '?'}, webhooks "
                  f"{lws.get('webhook', '-')} ({serving})")
        for proc in info.get("processes", []):
            mark = "running" if proc["running"] else "gone"
            _echo(f"  {proc['name']:<24} pid {proc['pid']:<8} {mark:<8} {proc['log']}")
    live = info["phase"] == "ready" and not info.get("stale_because")
    sys.exit(0 if live else 1)


@dev.command()
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory of the demo's cluster (default: <checkout>/.run/demo).")
@click.option("--example", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="PDDeployment to apply (default: the GB300 low-latency example).")
@click.option("--once", is_flag=True, help="Stop everything after printing the results.")
def demo(run_dir: Path | None, example: Path | None, once: bool) -> None:
    """The main job: cluster up (with the SGLang oracle service), CRDs, operator, apply the GB300 example,
    show plan and children."""
    import yaml

    from sglang_pd_operator_dev.cluster.demo import GB300_EXAMPLE, run_demo

    run_dir = run_dir or paths.default_run_dir().parent / "demo"
    example = (example or GB300_EXAMPLE).resolve()
    spec = (yaml.safe_load(example.read_text()) or {}).get("spec") or {}
    _stop_on_signals()
    try:  # the oracle's workers for the example's accelerator start at once
        running = start_cluster(run_dir=run_dir, log=_echo, oracle=True,
                                oracle_warm=(str(spec.get("accelerator") or "gb300"),))
    except (ClusterError, build.BuildError, gomod.GoModuleDownloadError, gomod.GoToolMissing) as err:
        raise click.ClickException(str(err)) from err
    except KeyboardInterrupt:
        raise click.Abort() from None
    code = 1
    try:
        code = run_demo(cluster=running, example=example, log=_echo, once=once)
    except KeyboardInterrupt:
        code = 0
    finally:
        running.stop(log=_echo)
    sys.exit(code)
