"""Find the ``python -m rltrain ...`` commands the README and docs/ show, as data.

A command is a line of a fenced code block that runs rltrain (``python -m rltrain``, ``rltrain``,
after an optional ``$ `` prompt or anywhere after ``--`` of a launcher such as ``ray job
submit``), with ``\\`` continuations joined and ``#`` comments dropped. When a ``$ `` command is
followed by a line starting ``rltrain: error:``, the docs promise that refusal: the command is
expected to fail with that text.
"""

from __future__ import annotations

import itertools
import pathlib
import re
import shlex
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[3]
RUNNERS = ("python -m rltrain ", "rltrain ")
#: Sub-commands and flags that are not a training or planning command line.
NOT_A_RUN = ("bench", "trace", "--help", "-h", "--hydra-help")


@dataclass(frozen=True)
class DocCommand:
    """One command shown in the docs.

    Attributes:
        where: ``file:line`` of the command.
        args: the arguments after the program name.
        expect_error: the start of the error the docs print for it, or None when it must work.
    """

    where: str
    args: tuple[str, ...]
    expect_error: str | None = None
    flags: tuple[str, ...] = field(default=())

    @property
    def multirun(self) -> bool:
        return "-m" in self.args or "--multirun" in self.args

    @property
    def is_run(self) -> bool:
        return not any(a in NOT_A_RUN for a in self.args)

    def override_sets(self) -> list[list[str]]:
        """The override lists this command composes (a sweep gives one per combination)."""
        overrides = [
            a
            for a in self.args
            if not a.startswith("-")
            and not a.startswith(("hydra.", "hydra/"))
            and a not in ("job", "defaults")
        ]
        if not self.multirun:
            return [overrides]
        choices = []
        for o in overrides:
            key, eq, value = o.partition("=")
            sweep = re.fullmatch(r"choice\((.*)\)", value)  # a sweeper's choice(a,b,...)
            if sweep:
                value = sweep.group(1)
            simple = eq and not re.search(r"[\[\]{}()'\"]", value)
            choices.append([f"{key}={v.strip()}" for v in value.split(",")] if simple else [o])
        return [list(c) for c in itertools.product(*choices)]


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    """Fenced code blocks: (line number of the first line, lines)."""
    out, current, start = [], None, 0
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if current is None:
                current, start = [], i + 1
            else:
                out.append((start, current))
                current = None
        elif current is not None:
            current.append(line)
    return out


def _command(line: str) -> str | None:
    text = line.strip()
    if text.startswith("$ "):
        text = text[2:]
    for runner in RUNNERS:
        if text.startswith(runner):
            return text[len(runner) :]
        marker = f" -- {runner}"
        if marker in text:
            return text.split(marker, 1)[1]
    return None


def extract(path: pathlib.Path) -> list[DocCommand]:
    """Every rltrain command in one Markdown file."""
    found = []
    rel = path.relative_to(ROOT)
    for start, lines in _blocks(path.read_text()):
        i = 0
        while i < len(lines):
            first, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            rest = _command(line)
            i += 1
            if rest is None:
                continue
            expect = None
            if line.strip().startswith("$ ") and i < len(lines):
                shown = lines[i].strip()
                if shown.startswith("rltrain: error:"):
                    expect = shown[len("rltrain: error:") :].strip().rstrip(".").strip()
            args = tuple(shlex.split(rest, comments=True))
            found.append(DocCommand(f"{rel}:{start + first}", args, expect))
    return found


def doc_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_commands() -> list[DocCommand]:
    return [c for p in doc_files() for c in extract(p)]
