"""``docs/config.md``: every config key, generated from the schema and the code that reads it.

For each field of :class:`~rltrain.config.schema.RunConfig` the reference gives its type, its
default, what it does (the comment beside the field in ``schema.py``, else the section's
docstring) and which modules read it. Readers are found in the source, not declared: an
attribute chain ``<anything>.<section>.<field>``, or ``<name>.<field>`` where ``<name>`` was
assigned ``<anything>.<section>`` in the same function. Validation (``rltrain/config/``) does
not count as reading: a key only validation reads is accepted and then ignored, and the test
that keeps this file up to date refuses that.

Regenerate with ``python -m rltrain.config.reference > docs/config.md``.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import pathlib
import tokenize
from collections import defaultdict
from typing import Any

from rltrain.config import schema
from rltrain.config.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from rltrain.kinds import registry
from rltrain.kinds.records import ENGINE_KEYS

PACKAGE = pathlib.Path(__file__).resolve().parents[1]
ROOT = PACKAGE.parent
#: Where readers are looked for (relative to the repository root).
SOURCES = ("rltrain", "hydra_plugins")
#: Not readers: the schema and its checks, this generator, and the benchmarks.
NOT_READERS = ("rltrain/config/", "rltrain/bench/")


#: Keys read by name rather than attribute (``get("devices_per_node")``, ``getattr(cfg, name)``):
#: key -> the modules that read them. A test checks each module's source names the field.
DYNAMIC_READERS: dict[str, tuple[str, ...]] = {
    # the task section is passed around as ``cfg`` (rltrain/tasks/build.py assembles the task)
    **{
        f"task.{k}": ("rltrain/tasks/build",)
        for k in (
            "num_train",
            "num_eval",
            "max_operand",
            "system_prompt",
            "prompt_key",
            "answer_key",
            "seed",
        )
    },
    # the plan sizes every model-parallel section by name (placement/plan.py), and the engine
    # checks refuse what the engines cannot run
    "rollout.pipeline_parallel_size": ("rltrain/placement/plan", "rltrain/runners/fusion"),
    "inference.tensor_parallel_size": ("rltrain/placement/plan",),
    "inference.pipeline_parallel_size": ("rltrain/placement/plan",),
    # placement=auto reads its section by name (AutoSettings)
    "placement.auto": ("rltrain/autoplace/settings",),
    # decided once by rltrain.config.numerics.resolve_old_logprobs, which the update's settings
    # and the cost model ask
    "algorithm.old_logprobs": ("rltrain/algorithms/update", "rltrain/autoplace/profile"),
}


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key of the reference."""

    key: str
    type: str
    default: str
    doc: str
    readers: tuple[str, ...]


def _comments(path: pathlib.Path) -> dict[int, str]:
    """Line number -> the comment on that line (or the comment block just above it)."""
    out: dict[int, str] = {}
    block: list[str] = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if tok.line.strip().startswith("#"):
                block.append(text)
            else:
                out[tok.start[0]] = text
        elif tok.type == tokenize.NL and not tok.line.strip():
            block = []
        elif tok.type == tokenize.NAME and block:
            out.setdefault(tok.start[0], " ".join(block))
            block = []
    return out


def _field_docs() -> dict[tuple[str, str], tuple[str, str]]:
    """(class name, field) -> (annotation as written, comment)."""
    path = pathlib.Path(schema.__file__)
    comments = _comments(path)
    out = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                note = comments.get(item.lineno, "")
                out[(node.name, item.target.id)] = (ast.unparse(item.annotation), note)
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and value == "???":
        return "required"
    return repr(value) if isinstance(value, str) else str(value)


def _sections() -> dict[str, type]:
    """Section name -> its dataclass (top-level sections of RunConfig)."""
    out = {}
    for f in dataclasses.fields(schema.RunConfig):
        factory = f.default_factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
            out[f.name] = factory
    return out


class _Readers(ast.NodeVisitor):
    """Collects ``(section, field)`` pairs a module reads."""

    def __init__(self, sections: dict[str, str], field_owners: dict[str, tuple[str, ...]]) -> None:
        self.sections = set(sections.values())
        self.by_class = sections  # "ModelConfig" -> "model"
        self.field_owners = field_owners  # "temp_dir" -> ("cluster",)
        self.found: set[tuple[str, str]] = set()
        self.aliases: list[dict[str, str]] = [{}]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        scope = {}
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            for cls, section in self.by_class.items():
                if cls in note:  # a parameter typed as a section: model_cfg: ModelConfig
                    scope[arg.arg] = section
        self.aliases.append(scope)
        self.generic_visit(node)
        self.aliases.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _alias(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._alias(t, v)
        elif (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Attribute)
            and value.attr in self.sections
        ):
            self.aliases[-1][target.id] = value.attr

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._alias(target, node.value)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        inner = node.value
        if isinstance(inner, ast.Attribute) and inner.attr in self.sections:
            self.found.add((inner.attr, node.attr))
        elif isinstance(inner, ast.Name):
            for scope in reversed(self.aliases):
                if inner.id in scope:
                    self.found.add((scope[inner.id], node.attr))
                    break
            else:  # a name that says which section it holds: task_cfg, logging_cfg, ...
                for section in self.sections:
                    if inner.id in (f"{section}_cfg", f"{section}_config"):
                        self.found.add((section, node.attr))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # reads by name: _get(config, "temp_dir"), cfg.get("cpus_per_node"), getattr(c, "x")
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in ("_get", "get", "getattr", "select"):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    owners = self.field_owners.get(arg.value.rsplit(".", 1)[-1], ())
                    if len(owners) == 1:
                        self.found.add((owners[0], arg.value.rsplit(".", 1)[-1]))
        self.generic_visit(node)


def find_readers() -> dict[str, set[str]]:
    """``section.field`` -> the modules (paths without ``.py``) that read it."""
    sections = {cls.__name__: name for name, cls in _sections().items()}
    owners: dict[str, list[str]] = defaultdict(list)
    for name, cls in _sections().items():
        for f in dataclasses.fields(cls):
            owners[f.name].append(name)
    field_owners = {k: tuple(v) for k, v in owners.items()}
    readers: dict[str, set[str]] = defaultdict(set)
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(NOT_READERS):
                continue
            visitor = _Readers(sections, field_owners)
            visitor.visit(ast.parse(path.read_text()))
            for section, name in visitor.found:
                readers[f"{section}.{name}"].add(rel[: -len(".py")])
    for key, modules in DYNAMIC_READERS.items():
        readers[key].update(modules)
    return readers


def keys() -> list[Key]:
    """Every leaf key of the run config, in schema order."""
    docs = _field_docs()
    readers = find_readers()
    out = []
    fields = dataclasses.fields(schema.RunConfig)
    top_doc = {f.name: docs.get(("RunConfig", f.name), ("", ""))[1] for f in fields}
    for f in dataclasses.fields(schema.RunConfig):
        section = _sections().get(f.name)
        if section is None:
            annotation, note = docs.get(("RunConfig", f.name), ("", ""))
            out.append(Key(f.name, annotation, _default(f), note or top_doc[f.name], ()))
            continue
        for sf in dataclasses.fields(section):
            annotation, note = docs.get((section.__name__, sf.name), ("", ""))
            key = f"{f.name}.{sf.name}"
            nested = sf.default_factory
            if nested is not dataclasses.MISSING and dataclasses.is_dataclass(nested):
                for nf in dataclasses.fields(nested):  # placement.auto.*: read as a section
                    n_ann, n_note = docs.get((nested.__name__, nf.name), ("", ""))
                    n_key = f"{key}.{nf.name}"
                    n_readers = readers.get(n_key) or readers.get(key) or ()
                    out.append(Key(n_key, n_ann, _default(nf), n_note, tuple(sorted(n_readers))))
                continue
            out.append(Key(key, annotation, _default(sf), note, tuple(sorted(readers[key]))))
    return out


def _top_level_readers() -> dict[str, set[str]]:
    """Readers of top-level scalars (``mode``, ``runner``, ``seed``): ``<x>.run.<name>`` or
    ``run.<name>`` / ``cfg.<name>`` attribute reads."""
    names = {f.name for f in dataclasses.fields(schema.RunConfig)} - set(_sections())
    found: dict[str, set[str]] = defaultdict(set)
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(NOT_READERS):
                continue
            # the task modules' ``cfg`` is the task section (its ``seed`` is ``task.seed``)
            holders: tuple[str, ...] = ("run", "run_cfg", "config")
            if not rel.startswith("rltrain/tasks/"):
                holders += ("cfg",)
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr in names
                    and isinstance(node.value, (ast.Name, ast.Attribute))
                    and (getattr(node.value, "id", None) or getattr(node.value, "attr", None))
                    in holders
                ):
                    found[node.attr].add(rel[: -len(".py")])
    return found


def render() -> str:
    """The Markdown reference."""
    top = _top_level_readers()
    lines = [
        "# Configuration reference",
        "",
        "Every key of rltrain's config, generated from `rltrain/config/schema.py` by",
        "`python -m rltrain.config.reference > docs/config.md` (a test keeps this file up to",
        "date). *Read by* lists the modules whose code reads the key; validation is not",
        "counted. Cross-field rules and the error messages are in `rltrain/config/validate.py`",
        "and `rltrain/config/engine_checks.py` (each engine's own in `rltrain/kinds/`); the",
        "values of `runner`, `actor.backend` and `rollout.backend` are the names of",
        "`rltrain.kinds.registry`, those of `algorithm.advantage_estimator` and",
        "`algorithm.policy_loss` the names of `rltrain/config/algorithms.py`.",
        "`python -m rltrain --cfg job` prints a composed config.",
        "",
        "A key set away from its default where the run would not read it (a LoRA scale at",
        "rank 0, a critic's learning rate with no critic placed, `env.*` on the reasoning",
        "runner, DAPO's penalty without its buffer, ...) is refused before Ray starts, naming",
        "the key and the fix (`rltrain/config/unread.py`, and each section's own checks); a key",
        "at its default never is.",
        "",
    ]
    section = None
    for k in keys():
        head = k.key.split(".")[0] if "." in k.key else "(top level)"
        if head != section:
            section = head
            cls = _sections().get(head)
            lines += ["", f"## `{head}`" if cls else "## top level", ""]
            if cls is not None and cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("):
                lines += [" ".join(cls.__doc__.split()), ""]
            lines += ["| key | type | default | what it does | read by |", "|---|---|---|---|---|"]
        readers = k.readers or tuple(sorted(top.get(k.key, ())))
        names = registry_names(k.key)
        doc = f"{' | '.join(names)}: {k.doc}" if names else k.doc
        cells = [
            f"`{k.key}`",
            f"`{k.type}`",
            f"`{k.default}`",
            doc.replace("|", "\\|"),
            ", ".join(f"`{r}`" for r in readers) or "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"


def registry_names(key: str) -> tuple[str, ...]:
    """The allowed values of a key whose values are a registry's names (else empty): the kinds'
    registry's, or the algorithm vocabulary's."""
    if key == "runner":
        return registry.runner_names()
    if key == "algorithm.advantage_estimator":
        return tuple(ADVANTAGE_ESTIMATORS)
    if key == "algorithm.policy_loss":
        return tuple(POLICY_LOSSES)
    roles = {v: r for r, v in ENGINE_KEYS.items()}
    return registry.engine_names(roles[key]) if key in roles else ()


def unread_keys() -> list[str]:
    """Keys no module outside validation reads (each one is accepted and then ignored)."""
    top = _top_level_readers()
    return [k.key for k in keys() if not k.readers and not top.get(k.key) and "." in k.key]


if __name__ == "__main__":
    print(render(), end="")
