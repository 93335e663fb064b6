"""The house's layering: no import circle among the Python modules (function-level imports
included, ``TYPE_CHECKING`` ones not), and no include or call circle in the native core
(fuzz/native_layers.py, docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "ckptzip"


def import_graph() -> dict[str, set[str]]:
    """Module -> the ckptzip modules it imports at run time (relative imports; a
    ``from . import x`` names the submodule ``x``)."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            parts = package.split(".")
            target = ".".join([*parts[: len(parts) - node.level + 1], node.module or ""]).rstrip(".")
            found = [f"{target}.{alias.name}" for alias in node.names
                     if f"{target}.{alias.name}" in modules]
            graph[module].update(found or ([target] if target in modules else []))
    return graph


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under an ``if TYPE_CHECKING:``."""
    found: list[ast.AST] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import circle, leaving out a package's imports of its own submodules (and theirs of
    it), which Python resolves; the search is the native layer check's."""
    sys.path.insert(0, str(ROOT / "fuzz"))
    try:
        from native_layers import find_cycle
    finally:
        sys.path.pop(0)
    return find_cycle({node: {nxt for nxt in targets if not (nxt.startswith(node + ".")
                                                             or node.startswith(nxt + "."))}
                       for node, targets in graph.items()})


def test_no_python_import_circle():
    graph = import_graph()
    assert graph["ckptzip.reader"] and graph["ckptzip.chain"]  # the graph is read at all
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # it finds one


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("clang") is None,
                    reason="no C compiler to read the core's symbols")
def test_no_native_include_or_call_circle():
    result = subprocess.run([sys.executable, str(ROOT / "fuzz" / "native_layers.py"), "--symbols"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
