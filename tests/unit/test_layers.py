"""The layer rules of ARCHITECTURE.md, read from the source: no package imports a layer above it.

Every ``import``/``from ... import`` of an ``rltrain`` module counts: at module level, inside a
function (a lazy import is still a dependency) and under ``if TYPE_CHECKING:`` (an annotation
that names a higher layer couples the two just the same). A package may import its own layer
and any layer below it, and no module imports itself back through others (no import cycles,
inside a package or across them).
"""

from __future__ import annotations

import ast
import functools
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Low to high. Each entry: the packages (or top-level modules) of one layer.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("config", "wire", "kinds"),
    ("telemetry",),
    ("placement",),
    ("whatif",),
    ("tasks", "rewards"),
    ("algorithms",),
    ("agents",),
    ("scheduler",),
    ("backends",),
    ("workers",),
    ("runners",),
    ("autoplace",),
    ("app", "help", "__main__", "bench", "conf"),
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _unit(module: str) -> str | None:
    """``rltrain.placement.plan`` -> ``placement``; None for modules outside rltrain."""
    parts = module.split(".")
    return parts[1] if parts[0] == "rltrain" and len(parts) > 1 else None


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, imported rltrain unit) of every import in a file."""
    return [(line, u) for line, module in module_imports(path) if (u := _unit(module))]


def module_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every ``rltrain`` module a file imports, resolved: ``from rltrain.a
    import b`` is ``rltrain.a.b`` when that is a module (else ``rltrain.a``); relative imports
    are resolved against the file's package."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found.append((node.lineno, base))  # runs the package's __init__ first
            for a in node.names:
                sub = f"{base}.{a.name}"
                if _is_module(sub):
                    found.append((node.lineno, sub))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in found if m == "rltrain" or m.startswith("rltrain.")]


@functools.cache
def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_name(path: pathlib.Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """module -> the rltrain modules it imports (packages by their ``__init__``)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "rltrain").rglob("*.py")):
        name = _module_name(path)
        graph[name] = {m for _, m in module_imports(path) if m != name and _is_module(m)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_unit_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in (ROOT / "rltrain").iterdir()}
    units = {u for u in units if not u.startswith(("_", ".")) or u == "__main__"} - {"py"}
    assert units <= set(RANK) | {"__init__", "py"}, sorted(units - set(RANK))


def test_no_package_imports_a_layer_above_it():
    upward = []
    for path in sorted((ROOT / "rltrain").rglob("*.py")):
        rel = path.relative_to(ROOT / "rltrain")
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if unit == "__init__":
            continue
        for line, dst in imports_of(path):
            if dst in RANK and RANK[dst] > RANK[unit]:
                upward.append(f"rltrain/{rel}:{line} ({unit}) imports {dst}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


#: Import cycles not yet broken, each named by its modules (sorted). Only ever shrinks: a new
#: cycle, or a module joining one of these, fails the test.
KNOWN_CYCLES: list[list[str]] = [
    # the Ray runtime: Worker.create_group -> WorkerGroupBuilder -> Worker, and the cluster's
    # and groups' annotations of each other
    [
        "rltrain.scheduler",
        "rltrain.scheduler.channel",
        "rltrain.scheduler.cluster",
        "rltrain.scheduler.collective",
        "rltrain.scheduler.group",
        "rltrain.scheduler.worker",
    ],
]


def test_no_import_cycles():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    found = [c for c in cycles(import_graph()) if c not in KNOWN_CYCLES]
    assert not found, "modules that import each other (break the cycle):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_cycle_finder_sees_lazy_and_type_checking_imports(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rltrain.runners.job import Job\n"
        "def f():\n    import rltrain.placement.plan\n"
    )
    assert {u for _, u in imports_of_text(src)} == {"runners", "placement"}


def imports_of_text(path: pathlib.Path) -> list[tuple[int, str]]:
    """:func:`imports_of` for a file outside the tree (absolute imports only)."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return [(line, u) for line, m in out if (u := _unit(m))]
