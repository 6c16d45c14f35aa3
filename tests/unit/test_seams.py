"""The package's seams, read from its source: front ends use the engine through its interface
only, the model reads K/V through the cell protocol only, the torch-free K/V bookkeeping
imports without torch, and no two packages import each other."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

import strata

ROOT = os.path.dirname(os.path.abspath(strata.__file__))
# The one module outside engine/ that may read the engine's parts: helpers for tests and
# benchmarks, never imported by the package.
TEST_HELPERS = {"strata.testing"}
ENGINE_PARTS = ("_scheduler", "_layout", "_kv", "_ring", "_runner", "_model", "_requests", "_sessions")
CELL_TYPES = {"Cells", "DenseCells", "Int8Cells", "RingCells"}
TORCH_FREE = ["strata.kv.pool", "strata.kv.table", "strata.kv.layout", "strata.kv.reserve", "strata.kv.residency",
              "strata.kv.ring_rule", "strata.kv.session_format", "strata.step", "strata.engine.scheduler",
              "strata.drafting.planner"]


def modules() -> Iterator[tuple[str, str, ast.Module]]:
    """(dotted name, source, tree) of every module of the package."""
    for folder, _, files in os.walk(ROOT):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
            dotted = rel.removesuffix(".__init__")
            with open(path, encoding="utf-8") as f:
                source = f.read()
            yield dotted, source, ast.parse(source)


def runtime_imports(tree: ast.Module) -> Iterator[str]:
    """Every strata module `tree` imports, at any depth, outside `if TYPE_CHECKING:` blocks."""
    def visit(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                yield from (a.name for a in child.names if a.name.startswith("strata"))
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").startswith("strata"):
                if child.module == "strata":
                    yield from (f"strata.{a.name}" for a in child.names)
                else:
                    yield child.module
            yield from visit(child)
    yield from visit(tree)


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: strata.engine.cache -> strata.engine."""
    return ".".join(module.split(".")[:2])


def test_front_ends_import_only_the_engine_interface():
    bad = []
    for name, _, tree in modules():
        if name.startswith("strata.engine") or name in TEST_HELPERS:
            continue
        bad += [(name, m) for m in runtime_imports(tree)
                if m.startswith("strata.engine.") and m != "strata.engine.interface"]
    assert not bad, f"modules outside engine/ import its internals: {bad}"


def test_nothing_outside_the_engine_reaches_its_parts():
    pattern = re.compile(r"\.(" + "|".join(ENGINE_PARTS) + r")\b")
    bad = [(name, m.group(0)) for name, source, _ in modules()
           if not name.startswith("strata.engine") and name not in TEST_HELPERS
           for m in pattern.finditer(source)]
    assert not bad, f"modules outside engine/ reach into the engine's parts: {bad}"


def test_the_model_layer_knows_only_the_cell_protocol():
    for name, _, tree in modules():
        if not name.startswith("strata.models"):
            continue
        assert not [m for m in runtime_imports(tree) if m.startswith("strata.cells")], name
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                assert not names & CELL_TYPES, f"{name}: isinstance on a cell type ({ast.unparse(node)})"


def test_no_two_packages_import_each_other():
    edges: dict[str, set[str]] = {}
    for name, _, tree in modules():
        for m in runtime_imports(tree):
            if unit(m) != unit(name):
                edges.setdefault(unit(name), set()).add(unit(m))
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                pytest.fail(f"import cycle: {' -> '.join(path[path.index(nxt):] + [nxt])}")
            if nxt not in seen:
                walk(nxt, path + [nxt])
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            walk(node, [node])


def test_the_bookkeeping_imports_without_torch():
    """In a fresh interpreter where `import torch` fails, the pool, tables, layouts, residency,
    the ring rule, the session format, the step records, the scheduler and the draft planner
    import and work."""
    code = ("import sys; sys.modules['torch'] = None\n"
            + "".join(f"import {m}\n" for m in TORCH_FREE)
            + "from strata.kv.layout import PooledLayout\n"
              "from strata.engine.scheduler import Scheduler\n"
              "s = Scheduler(PooledLayout(4, 4), 1, 16, 8)\n"
              "s.add('a', [1, 2, 3]); p = s.schedule(); assert p.work[0].chunk_ids == (0,)\n"
              "assert 'torch' not in {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_module_imports_in_a_fresh_interpreter():
    """Each module on its own (no import order hides a cycle between modules)."""
    names = [n for n, _, _ in modules() if not n.endswith("__main__")]
    code = ("import importlib, sys\n"
            "bad = []\n"
            f"for name in {names!r}:\n"
            "    for m in [k for k in sys.modules if k.startswith('strata')]:\n"
            "        del sys.modules[m]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as exc:\n"
            "        bad.append((name, repr(exc)))\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
