"""``sglang-pd-operator`` with the KernelBuild handlers registered (e2e launcher).

handlers.py is to import ``sglang_pd_operator.handlers_kernelbuild`` (kopf registers
handlers at import); until it does, the KernelBuild e2e tests start the operator through
this script, which imports that module first and then runs the normal command line.
Once handlers.py imports it, this script changes nothing (a module is imported once).

Run as a script with ``PYTHONSAFEPATH=1`` and a working directory outside the checkout
(as OperatorProcess does), never as ``python -m`` from the repository root.
"""

from __future__ import annotations

import sys

import sglang_pd_operator.handlers_kernelbuild  # noqa: F401  (registers the handlers)
from sglang_pd_operator.cli import main

if __name__ == "__main__":
    sys.exit(main())
