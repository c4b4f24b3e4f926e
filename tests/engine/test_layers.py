"""The engine's sub-packages import one way, and no two engine files import each other.

Bottom to top: ``core`` (with the top-level ``errors`` module) <- ``model`` <- ``formats`` <-
``runtime`` <- ``training``. A module may import its own sub-package and any below it, never one
above. Every import counts: module-level, inside a function (a lazy import is still a dependency)
and under ``if TYPE_CHECKING:``. The scan reads the source with :mod:`ast`, so it also covers
branches only a GPU reaches (the Triton kernel modules are never imported here).

Worked example: ``engine/model/model.py`` doing ``from eaglelab.engine.runtime.kv_cache import
KVCache`` is the edge model -> runtime, rank 1 -> 3, upward: the test names that file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine"
PREFIX = "eaglelab.engine"
LAYERS = ("core", "model", "formats", "runtime", "training")  # bottom to top
TOP_MODULES = {"errors": "core", "__init__": "core"}  # engine/errors.py sits with core


def module_name(path: Path) -> str:
    """``engine/runtime/tree.py`` -> ``eaglelab.engine.runtime.tree`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(ENGINE).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join((PREFIX, *parts))


def layer_of(module: str) -> str:
    """The sub-package a dotted engine module belongs to."""
    rest = module[len(PREFIX) + 1:].split(".") if module != PREFIX else ["__init__"]
    return rest[0] if rest[0] in LAYERS else TOP_MODULES[rest[0]]


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, engine module) of every import of an engine module anywhere in ``tree``.

    ``from eaglelab.engine.runtime import cycle_ops`` names the module ``...runtime.cycle_ops``;
    ``from eaglelab.engine.runtime.tree import DraftTree`` names ``...runtime.tree``.
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(package + ([base] if base else []))
            for a in node.names:
                submodule = f"{base}.{a.name}"
                found.append((node.lineno, submodule if (ENGINE_FILES.get(submodule)) else base))
    return [(line, name) for line, name in found if name == PREFIX or name.startswith(PREFIX + ".")]


def engine_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}


ENGINE_FILES = engine_files()
IMPORTS = {
    name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py")
    for name, path in ENGINE_FILES.items()
}


def test_every_sub_package_has_a_layer() -> None:
    """A new sub-package must be placed in the order (and in pyproject.toml's package list)."""
    packages = {p.parent.name for p in ENGINE.glob("*/__init__.py")}
    assert packages == set(LAYERS), f"engine sub-packages {sorted(packages)} vs the layer order {LAYERS}"
    pyproject = (ENGINE.parent / "pyproject.toml").read_text()
    for layer in LAYERS:
        assert f'"eaglelab.engine.{layer}"' in pyproject, f"pyproject.toml's packages lack eaglelab.engine.{layer}"


def test_imports_point_down_the_layers() -> None:
    """No engine module imports a sub-package above its own."""
    upward: list[str] = []
    for name, edges in IMPORTS.items():
        rank = LAYERS.index(layer_of(name))
        for line, target in edges:
            said = f"{ENGINE_FILES[name]}:{line} ({layer_of(name)}) imports {target} ({layer_of(target)})"
            if LAYERS.index(layer_of(target)) > rank and said not in upward:
                upward.append(said)
    assert not upward, "imports against the order " + " <- ".join(LAYERS) + ":\n" + "\n".join(upward)


def import_cycles() -> list[list[str]]:
    """Every cycle of the file-level import graph, each once (Tarjan's strongly connected components)."""
    graph = {name: sorted({t for _, t in edges if t in ENGINE_FILES and t != name}) for name, edges in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_between_files() -> None:
    """No two engine files reach each other through imports (lazy and type-only imports included)."""
    cycles = import_cycles()
    assert not cycles, "engine files importing each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("source, expected", [
    ("from eaglelab.engine.runtime import cycle_ops", [(1, "eaglelab.engine.runtime.cycle_ops")]),
    ("def f():\n    from eaglelab.engine.runtime.tree import DraftTree", [(2, "eaglelab.engine.runtime.tree")]),
    ("import eaglelab.engine.model.model as m", [(1, "eaglelab.engine.model.model")]),
    ("from eaglelab.engine.errors import ConfigError", [(1, "eaglelab.engine.errors")]),
    ("import torch", []),
])
def test_the_scan_sees_each_kind_of_import(source: str, expected: list[tuple[int, str]]) -> None:
    """The scanner itself: plain, from-package, function-local and aliased imports are all found."""
    assert imported(ast.parse(source), "eaglelab.engine.training.train", False) == expected


def test_the_order_check_would_catch_an_upward_import() -> None:
    """model -> runtime is upward; runtime -> model is not (the check's rule, on a known pair)."""
    assert LAYERS.index(layer_of("eaglelab.engine.runtime.generate")) > LAYERS.index(layer_of("eaglelab.engine.model.model"))
    assert layer_of("eaglelab.engine.errors") == "core"


MAX_LINES = 700  # issue #37: a file past this reads as two; split it along a real seam


def test_no_engine_file_is_over_the_line_budget() -> None:
    """Every engine module stays readable in one sitting (at most MAX_LINES lines)."""
    long = {str(p): n for p in ENGINE_FILES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"engine files over {MAX_LINES} lines: {long}"
