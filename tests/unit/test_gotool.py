"""hack/gotool.py: the cache key of a Go tool covers every input of its build."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gotool", ROOT / "hack" / "gotool.py")
gotool = sys.modules.setdefault("gotool", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(gotool)  # registered first: a dataclass looks its module up


def _tool(module_dir: Path, **kw) -> "gotool.GoTool":
    return gotool.GoTool(name="t", package=".", module_dir=module_dir, env_override="T_UNUSED", **kw)


def test_a_source_of_our_own_is_part_of_the_cache_key(tmp_path):
    for name, text in (("go.mod", "module x\n"), ("go.sum", ""), ("main.go", "package main\n")):
        (tmp_path / name).write_text(text)
    with_source, without = _tool(tmp_path, sources=("main.go",)), _tool(tmp_path)
    before, plain = with_source.module_hash(), without.module_hash()
    assert before != plain
    (tmp_path / "main.go").write_text("package main\n\nfunc main() {}\n")
    assert with_source.module_hash() != before  # an edited command is built again
    assert without.module_hash() == plain  # a tool without sources keys on go.mod and go.sum only


def test_imageref_keys_on_its_main_go():
    _s = importlib.util.spec_from_file_location("build_imageref", ROOT / "hack" / "imageref" / "build_imageref.py")
    build = importlib.util.module_from_spec(_s)
    _s.loader.exec_module(build)
    assert build.IMAGEREF.sources == ("main.go",)
    assert (build.MODULE_DIR / "main.go").is_file() and (build.MODULE_DIR / "go.sum").is_file()
