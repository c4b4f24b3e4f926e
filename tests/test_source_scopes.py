"""No function reads a name before its own local binding of it (an UnboundLocalError waiting).

A binding anywhere in a function (an assignment, a ``from m import x`` inside an ``if``) makes the
name local to the whole function: an earlier read then raises UnboundLocalError, even when a
module-level name of that spelling exists. ``run_config`` in eaglelab/bench/harness.py once read
``replace`` (the module's dataclasses import) for ``*-gemv`` rows, then re-imported it under
``if fallbacks:``; CPU tests skip those rows (CUDA graphs, Triton), so only the H200 saw it. This
scan reads every source file, so it also covers branches only a GPU reaches.
"""

from __future__ import annotations

import ast
import symtable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eaglelab", "engine", "probes", "tui")
Pos = tuple[int, int]  # (line, column)


class OwnScope(ast.NodeVisitor):
    """One function's own reads and bindings, each at the point it takes effect (a target binds
    after its value is computed); nested functions, classes and comprehensions only contribute what
    runs in this scope (decorators, defaults, bases, the first iterable) and the name they bind."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.reads: list[tuple[Pos, str]] = []
        self.binds: list[tuple[Pos, str]] = []
        self._after: list[Pos] = []  # where the targets being visited bind
        for stmt in fn.body:
            self.visit(stmt)

    def _bind(self, name: str, node: ast.AST) -> None:
        self.binds.append((self._after[-1] if self._after else (node.lineno, node.col_offset), name))

    def _targets(self, targets: list[ast.AST], value: ast.AST) -> None:
        self.visit(value)
        self._after.append((value.end_lineno, value.end_col_offset))
        for t in targets:
            self.visit(t)
        self._after.pop()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.reads.append(((node.lineno, node.col_offset), node.id))
        else:
            self._bind(node.id, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._targets(node.targets, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._targets([node.target], node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._targets([node.target], node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):  # reads, then binds
            self.reads.append(((node.target.lineno, node.target.col_offset), node.target.id))
            self.binds.append(((node.end_lineno, node.end_col_offset), node.target.id))
        else:
            self.visit(node.target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._targets([node.target], node.iter)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self._targets([item.optional_vars] if item.optional_vars else [], item.context_expr)
        for stmt in node.body:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            self._bind(alias.asname or alias.name.split(".")[0], node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self._bind(node.name, node)
        for stmt in node.body:
            self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        runs_here = node.decorator_list + (node.bases + [k.value for k in node.keywords]
                                           if isinstance(node, ast.ClassDef) else _defaults(node.args))
        for expr in runs_here:
            self.visit(expr)
        self._bind(node.name, node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in _defaults(node.args):
            self.visit(expr)

    def visit_ListComp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        self.visit(node.generators[0].iter)

    visit_AsyncFor, visit_AsyncWith, visit_ImportFrom = visit_For, visit_With, visit_Import
    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef
    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return args.defaults + [d for d in args.kw_defaults if d is not None]


def _function_tables(table: symtable.SymbolTable, out: dict) -> dict:
    """(name, line) -> symbol table of every function in ``table``."""
    for child in table.get_children():
        if child.get_type() == "function":
            out[(child.get_name(), child.get_lineno())] = child
        _function_tables(child, out)
    return out


def reads_before_binding(source: str, filename: str) -> list[str]:
    """'file:line: function reads NAME before binding it at line L', one per offending read."""
    tables = _function_tables(symtable.symtable(source, filename, "exec"), {})
    found = []
    for fn in ast.walk(ast.parse(source, filename)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        table = tables[(fn.name, fn.lineno)]  # both give the line of ``def``, decorators aside
        local = {s.get_name() for s in table.get_symbols() if s.is_local() and not s.is_parameter()}
        scope = OwnScope(fn)
        first: dict[str, Pos] = {}
        for at, name in sorted(scope.binds):
            first.setdefault(name, at)
        found += [f"{filename}:{at[0]}: {fn.name} reads {name!r} before binding it at line {first[name][0]}"
                  for at, name in sorted(scope.reads) if name in local and at < first.get(name, at)]
    return found


def _sources() -> list[Path]:
    """Every .py of the packages and benchmarks/ (each once: a checkout may link eaglelab/engine to engine/)."""
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + list((ROOT / "benchmarks").glob("*.py"))
    return sorted({p.resolve() for p in files if "__pycache__" not in p.parts})


HARNESS_BUG = '''
from dataclasses import replace

def run_config(row, gemv, fallbacks):
    if gemv:
        row = replace(row, gemv="on")
    if fallbacks:
        from dataclasses import replace
        row = replace(row, compile_fallbacks=fallbacks)
    return row
'''


@pytest.mark.parametrize("source, expected", [
    (HARNESS_BUG, ["x.py:6: run_config reads 'replace' before binding it at line 8"]),
    ("import os\ndef f():\n    print(os.sep)\n    os = 3\n", ["x.py:3: f reads 'os' before binding it at line 4"]),
    ("def f():\n    total += 1\n", ["x.py:2: f reads 'total' before binding it at line 2"]),
    ("def f(n):\n    n = n + 1\n    for i in range(n):\n        i = i + 1\n    with open(n) as h:\n        h = h.read()\n"
     "    return [replace for replace in h], (m := 3) + m, lambda: h\n", []),
    ("from dataclasses import replace\ndef f(x):\n    def g():\n        return replace(x)\n    return g\n", []),
])
def test_the_scan_finds_a_read_before_the_local_binding(source, expected):
    assert reads_before_binding(source, "x.py") == expected


def test_no_function_in_the_package_reads_a_name_before_binding_it():
    files = _sources()
    assert len(files) > 50, f"scanned only {len(files)} files under {ROOT}"
    found = [hit for path in files for hit in reads_before_binding(path.read_text(encoding="utf-8"),
                                                                   str(path.relative_to(ROOT)))]
    assert found == [], "\n".join(found)
