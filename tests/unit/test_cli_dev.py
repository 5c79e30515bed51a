"""``sglang-pd-operator dev ...``: the dev tools' commands, loaded from their entry point only when run.

The operator's command line never imports the dev package by name (test_layers.py): the
dev tools (devtools/, distribution sglang-pd-operator-dev) register the ``dev`` group in
the entry point group ``sglang_pd_operator.cli``. Where they are installed (hack/setup.sh)
``dev`` is theirs; where they are not (the operator image), ``dev`` says how to get them.
"""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from sglang_pd_operator import cli


def test_dev_comes_from_the_installed_dev_tools():
    (entry,) = [ep for ep in cli._plugins() if ep.name == "dev"]
    assert entry.value == "sglang_pd_operator_dev.cluster.cli:dev"
    result = CliRunner().invoke(cli.main, ["dev", "cluster", "--help"])
    assert result.exit_code == 0, result.output
    for command in ("up", "down", "status", "build"):
        assert command in result.output


def test_without_the_dev_tools_dev_says_how_to_install_them(monkeypatch):
    monkeypatch.setattr(cli, "_plugins", lambda: [])
    for args in (["dev", "cluster", "up", "--detach"], ["dev", "demo", "--once"], ["dev"], ["dev", "--help"]):
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 1, (args, result.output)
        assert "./hack/setup.sh" in result.output and "pip install -e ./devtools" in result.output, result.output
    listing = CliRunner().invoke(cli.main, ["--help"])
    assert listing.exit_code == 0 and "dev" in listing.output
    assert CliRunner().invoke(cli.main, ["nope"]).exit_code == 2  # an unknown command stays click's usage error


def test_check_does_not_import_the_dev_tools():
    code = ("import sys; from sglang_pd_operator import cli; "
            "cli.main.get_command(None, 'check'); cli.main.list_commands(None); "
            "print([m for m in sys.modules if m.startswith('sglang_pd_operator_dev')])")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
