"""The import layering of docs/architecture.md, pinned by reading every module's imports.

Every ``import`` and ``from ... import`` statement of every module under ``agent/``, ``feeds/``
and ``storage/`` is read with :mod:`ast` (those inside functions too: a lazy import is still a
dependency), and the first-party ones are checked against the allowed directions:

* ``feeds`` and ``storage`` never import ``agent``;
* ``agent/kernels`` and ``agent/gpu`` never import the daemon, the trainer, the backtests or the
  trading core, and ``agent/kernels`` never imports ``agent/gpu`` (the GPU layer uses the kernels);
* the daemon, the trading core, the execution layer and the policy never import the trainer or
  the backtests;
* the packages form no import cycle.

For the cycle check a module belongs to its package (``agent.<pkg>``, or ``feeds``, ``storage``),
except two kinds of leaf every package exposes, which are nodes of their own: its typed settings
(``agent/<pkg>/config.py``, gathered by the composition root ``agent/config.py``) and its error
tree (``agent/<pkg>/errors.py``). The leaves import only other leaves, ``agent.errors`` and the
foundations, so a package that takes the aggregate ``Config`` depends on every package's
settings, never on the packages themselves.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("agent", "feeds", "storage")
LEAVES = ("config", "errors")

TRADING_AND_ABOVE = ("agent.daemon", "agent.train", "agent.backtest", "agent.trading")
TRAINER_AND_BACKTESTS = ("agent.train", "agent.backtest")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "feeds": ("agent",),
    "storage": ("agent",),
    "agent.kernels": (*TRADING_AND_ABOVE, "agent.gpu"),
    "agent.gpu": TRADING_AND_ABOVE,
    "agent.daemon": TRAINER_AND_BACKTESTS,
    "agent.trading": TRAINER_AND_BACKTESTS,
    "agent.execution": TRAINER_AND_BACKTESTS,
    "agent.policy": TRAINER_AND_BACKTESTS,
}
"""Package -> the packages it must not import (directly; each prefix covers its subpackages)."""


def _modules() -> dict[str, Path]:
    """Every first-party module by dotted name (a package by its ``__init__``)."""
    out = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from`` import names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _imports(module: str, path: Path) -> set[str]:
    """The first-party modules ``module`` imports (``from pkg import submodule`` as the submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(node, module, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in MODULES else source)
    return {name for name in found if name.split(".")[0] in ROOTS}


IMPORTS = {module: _imports(module, path) for module, path in MODULES.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_leaf(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "agent" and len(parts) == 3 and parts[2] in LEAVES


def _node(module: str) -> str:
    """The module's node in the package graph (see the module docstring)."""
    parts = module.split(".")
    if parts[0] != "agent":
        return parts[0]
    return module if _is_leaf(module) else ".".join(parts[:2])


def _edges() -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> the module imports behind that edge (``a -> b``)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, imported in IMPORTS.items():
        for target in imported:
            a, b = _node(module), _node(target)
            if a != b:
                graph[a][b].append(f"{module} -> {target}")
    return graph


def _cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph) | {b for targets in graph.values() for b in targets}):
        if node not in index:
            visit(node)
    return found


def test_the_parser_sees_the_tree() -> None:
    """Guards the other tests against passing vacuously."""
    assert len(MODULES) > 150
    graph = _edges()
    assert "agent.trading" in graph["agent.daemon"]
    assert "agent.backtest" in graph["agent.train"]
    assert "agent.train.config" in graph["agent.config"]
    assert "agent.trading" in graph["agent.backtest"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_never_imports_the_layers_above_it(package: str) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, imported in IMPORTS.items()
        if _within(module, package)
        for target in imported
        if any(_within(target, banned) for banned in FORBIDDEN[package])
    )
    assert not wrong, f"{package} must not import {', '.join(FORBIDDEN[package])}:\n" + "\n".join(wrong)


def test_settings_and_error_modules_are_leaves() -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, imported in IMPORTS.items()
        if _is_leaf(module)
        for target in imported
        if not (_is_leaf(target) or target == "agent.errors" or target.split(".")[0] != "agent")
    )
    assert not wrong, "a package's config.py and errors.py import only leaves:\n" + "\n".join(wrong)


def test_the_packages_form_no_import_cycle() -> None:
    graph = _edges()
    cycles = _cycles(graph)
    lines = []
    for nodes in cycles:
        lines.append(" <-> ".join(nodes))
        lines.extend(
            f"    {edge}" for a in nodes for b in nodes if b in graph.get(a, {}) for edge in graph[a][b][:3]
        )
    assert not cycles, "import cycles between packages:\n" + "\n".join(lines)
