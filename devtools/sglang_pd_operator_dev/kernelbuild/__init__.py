"""The ``standin`` KernelBuild recipe, for tests on machines without GPUs.

- :mod:`.standin` the stand-in compile/serve program (standard library only).
- :mod:`.recipe`  the recipe (``standin.yaml``) added to a copy of the operator's build
  catalog, which never carries it, and the copy of the program next to an installed builder.

Imports nothing at package level (see :mod:`.standin`).
"""
