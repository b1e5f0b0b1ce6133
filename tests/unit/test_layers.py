"""The layer rules of ARCHITECTURE.md, read from the source: no package imports a layer above it.

Every ``import``/``from ... import`` of an ``rltrain`` module counts, at module level or inside a
function (a lazy import is still a dependency); only ``if TYPE_CHECKING:`` blocks are left out
(annotations, not dependencies). A package may import its own layer and any layer below it.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Low to high. Each entry: the packages (or top-level modules) of one layer.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("config", "wire"),
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


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, imported rltrain unit) of every runtime import in a file."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            unit = _unit(node.module)
            if node.module == "rltrain":  # from rltrain import tasks
                found += [(node.lineno, a.name) for a in node.names]
            elif unit:
                found.append((node.lineno, unit))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, u) for a in node.names if (u := _unit(a.name))]
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
