"""``python -m sglang_pd_operator_dev.cluster up|down|status|build``: the cluster commands
without the main CLI (same commands as ``sglang-pd-operator dev cluster ...``)."""

from sglang_pd_operator_dev.cluster.cli import cluster

if __name__ == "__main__":
    cluster(prog_name="python -m sglang_pd_operator_dev.cluster")
