"""``task.generate=calc_tool``: sums too long for the tiny model to add alone, and a calculator.

``experiment=calc_tool`` trains an agent on two cores in minutes. Each prompt is a sum of
``task.params.num_terms`` numbers below ``10**digits`` (``"347+589+126="``); the answer is its
value. :class:`CalculatorEnv` (``task.env=rltrain.tasks.calc_tool:CalculatorEnv``) gives the
model one tool, ``calculator``; the demonstrated episode copies the sum into a call, reads the
result and answers with it::

    347+589+126=calculator[347+589+126]=1062;1062<eos>
                ^ model turn 1          ^ tool  ^ model turn 2

The generator writes the train/eval rows (JSONL: ``prompt``, ``answer``) and a base checkpoint
(the built-in one-character-per-token tokenizer over :data:`ALPHABET` and a tiny Llama from the
``model`` fields), briefly supervised on demonstrations with the tool's result masked out of the
loss (``task.params.sft_steps``), as ``gsm8k_tiny`` writes its base chat checkpoint. RL then
raises greedy accuracy (docs/agents.md). Everything is written once and kept (a stamp records
what was generated and where; other settings regenerate it). Like every generator it writes
only where it wrote before: a checkpoint holding its stamp, a data file whose mark beside it
(``<file>.generated_by_rltrain_calc_tool.json``, the file's SHA-256) matches its content. A
user's checkpoint or data file at one of its paths is refused, naming ``task.generate=null``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from rltrain.tasks.generated import checked_spec, ensure_written, held_stamp
from rltrain.tasks.text_env import ToolEnv, ToolError
from rltrain.tasks.tool_format import format_call, format_result

log = logging.getLogger(__name__)

#: Bumped when the rows or the checkpoint recipe change.
VERSION = 1
STAMP = "generated_by_rltrain_calc_tool.json"
#: The characters the checkpoint's tokenizer spells (one token each).
ALPHABET = "0123456789+=[];calutor"
SFT_LABEL = "calc_tool: supervising the base checkpoint"
#: Suffix of the mark written beside each data file: JSON lines hold no metadata, and the mark
#: must outlive the checkpoint (deleted, or never saved when the supervised steps are cut short)
#: for the generator to know the file as its own.
FILE_MARK_SUFFIX = ".generated_by_rltrain_calc_tool.json"


class CalculatorEnv(ToolEnv):
    """A sum to answer, with a calculator (``task.env`` of ``experiment=calc_tool``)."""

    def calculator(self, expression: str) -> str:
        """Add the numbers of a sum such as ``12+345+6`` and return the total."""
        terms = expression.split("+")
        if not expression or not all(t.isdigit() for t in terms):
            raise ToolError("digits and + only")
        return str(sum(int(t) for t in terms))


@dataclass(frozen=True)
class CalcToolSpec:
    """What ``task.generate=calc_tool`` writes (``task.params`` keys of the same names).

    Attributes:
        num_train: training sums.
        num_eval: evaluation sums (none of the training set).
        num_terms: numbers per sum.
        digits: each number is below ``10**digits``.
        sft_steps: supervised steps on demonstrations before the checkpoint is saved.
        sft_batch_size: demonstrations per supervised step.
        sft_lr: the supervised steps' AdamW learning rate.
        seed: which sums, and the supervised batches (``task.seed``).
    """

    num_train: int = 2000
    num_eval: int = 400
    num_terms: int = 3
    digits: int = 3
    sft_steps: int = 250
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    seed: int = 0

    #: the ``task.generate`` value that writes it, for messages
    generator: ClassVar[str] = "calc_tool"

    @classmethod
    def from_params(cls, params: dict[str, Any], seed: int) -> CalcToolSpec:
        """Read the spec from ``task.params``.

        Raises:
            ConfigError: a value of the wrong type or out of range.
        """
        return checked_spec(cls, params, seed)

    def problems(self) -> list[str]:
        """What is out of range, as messages naming ``task.params.*``."""
        out = []
        for name in ("num_train", "num_eval", "sft_batch_size"):
            if getattr(self, name) < 1:
                out.append(f"task.params.{name}={getattr(self, name)} must be >= 1")
        if not 2 <= self.num_terms <= 8:
            out.append(f"task.params.num_terms={self.num_terms} must be in 2..8")
        if not 1 <= self.digits <= 6:
            out.append(f"task.params.digits={self.digits} must be in 1..6")
        if not 0 <= self.sft_steps <= 100_000:
            out.append(f"task.params.sft_steps={self.sft_steps} must be in 0..100000")
        if not 0 < self.sft_lr <= 1:
            out.append(f"task.params.sft_lr={self.sft_lr} must be in (0, 1]")
        if not out and self.num_train + self.num_eval > (10**self.digits) ** self.num_terms:
            out.append(
                f"task.params.num_train + num_eval = {self.num_train + self.num_eval} is too "
                f"many distinct sums for num_terms={self.num_terms}, digits={self.digits}"
            )
        return out


def sums(spec: CalcToolSpec) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The distinct training and evaluation rows (``prompt``, ``answer``), seeded."""
    rng = random.Random(f"calc_tool-{VERSION}-{spec.seed}")
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    while len(rows) < spec.num_train + spec.num_eval:
        terms = [rng.randrange(10**spec.digits) for _ in range(spec.num_terms)]
        prompt = "+".join(map(str, terms)) + "="
        if prompt not in seen:
            seen.add(prompt)
            rows.append({"prompt": prompt, "answer": str(sum(terms))})
    return rows[: spec.num_train], rows[spec.num_train :]


def demonstration(prompt: str, answer: str) -> list[tuple[str, bool]]:
    """The demonstrated episode as ``(text, trained_on)`` pieces: the call, the tool's result
    (not trained on), the answer."""
    expression = prompt.rstrip("=")
    return [
        (format_call("calculator", expression), True),
        (format_result(answer), False),
        (answer, True),
    ]


def _sft_rows(
    tok: Any, rows: list[dict[str, str]]
) -> list[tuple[list[int], list[int], list[bool]]]:
    """``(prompt ids, response ids, trained_on per response id)`` per demonstration; the
    response ends with EOS (trained on)."""
    from rltrain.tasks.tokenizer import prompt_token_ids

    prompts = prompt_token_ids(tok, [r["prompt"] for r in rows])
    out = []
    for p, r in zip(prompts, rows, strict=True):
        ids: list[int] = []
        keep: list[bool] = []
        for text, trained in demonstration(r["prompt"], r["answer"]):
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids += piece
            keep += [trained] * len(piece)
        out.append((list(p), [*ids, tok.eos_token_id], [*keep, True]))
    return out


def supervise(
    model: Any, tok: Any, rows: list[dict[str, str]], spec: CalcToolSpec, progress: bool = False
) -> list[float]:
    """``spec.sft_steps`` AdamW steps (:func:`rltrain.tasks.sft.supervised_finetune`) on
    demonstrations of ``rows``, the tool's results masked out of the loss.

    Args:
        model: the causal LM to train in place.
        tok: its tokenizer (the character one over :data:`ALPHABET`).
        rows: the training sums (``prompt``, ``answer``).
        spec: the steps, batch size, learning rate and seed.
        progress: show the steps' progress (``logging.progress``).

    Returns:
        The loss of every step.
    """
    from rltrain.tasks.sft import shown_steps, supervised_finetune

    demos = _sft_rows(tok, rows)
    with shown_steps(SFT_LABEL, spec.sft_steps, progress) as on_step:
        return supervised_finetune(
            model,
            [(p, r) for p, r, _ in demos],
            tok.pad_token_id,
            spec.sft_steps,
            spec.sft_batch_size,
            spec.sft_lr,
            seed=spec.seed,
            on_step=on_step,
            trained=[keep for _, _, keep in demos],
        )


def _stamp(spec: CalcToolSpec, model_cfg: Any, paths: tuple[str, str]) -> dict[str, Any]:
    from rltrain.config.schema import MODEL_SIZE_FIELDS

    # every model field the checkpoint is built from (vocab_size pads its embedding rows)
    sized = ("family", *MODEL_SIZE_FIELDS, "vocab_size", "tie_word_embeddings", "init_seed")
    return {
        "generator": "calc_tool",
        "version": VERSION,
        "spec": asdict(spec),
        "model": {k: getattr(model_cfg, k) for k in sized},
        # the data files written with the checkpoint: only these may be rewritten later
        "data": [os.path.abspath(p) for p in paths],
    }


def _held_stamp(model_dir: str) -> dict[str, Any] | None:
    return held_stamp(model_dir, STAMP, "calc_tool")


def _current(stamp: dict[str, Any], model_dir: str) -> bool:
    return _held_stamp(model_dir) == stamp and all(_marked(p) for p in stamp["data"])


def _file_mark(text: bytes) -> dict[str, str]:
    return {"generator": "calc_tool", "sha256": hashlib.sha256(text).hexdigest()}


def _marked(path: str) -> bool:
    """Whether the data file at ``path`` is, byte for byte, the one the generator wrote there.

    The mark beside it holds the written file's digest, so a file the user replaced or edited
    since is not taken for the generator's.
    """
    try:
        with open(path + FILE_MARK_SUFFIX) as f:
            mark = json.load(f)
        with open(path, "rb") as f:
            return bool(mark == _file_mark(f.read()))
    except (OSError, ValueError):
        return False


def foreign_outputs(paths: tuple[str, str], model_dir: str) -> list[str]:
    """What the generator would overwrite without having written it: one message per path.

    A checkpoint directory is the generator's when it holds its stamp; a data file when its
    mark matches it, or the stamp names it (written before files were marked). Anything else
    already there is the user's and is never replaced.

    Args:
        paths: ``task.path`` and ``task.eval_path``.
        model_dir: ``model.path``.

    Returns:
        Problem messages naming the key, the path and the fix; empty when every path is free or
        the generator's own.
    """
    fix = (
        "set task.generate=null to use it as it is, or point {key} at a path that does not "
        "exist yet (experiment=calc_tool puts all three under task.params.data_dir)"
    )
    held = _held_stamp(model_dir)
    problems = []
    if os.path.lexists(model_dir) and held is None:
        problems.append(
            f"model.path={model_dir!r} exists and task.generate='calc_tool' did not write it "
            f"(no {STAMP} in it), so the generator will not replace it: "
            + fix.format(key="model.path")
        )
    ours = set(held["data"]) if held and isinstance(held.get("data"), list) else set()
    for key, path in zip(("task.path", "task.eval_path"), paths, strict=True):
        if os.path.lexists(path) and not (_marked(path) or os.path.abspath(path) in ours):
            problems.append(
                f"{key}={path!r} exists and task.generate='calc_tool' did not write it, so the "
                f"generator will not overwrite it: " + fix.format(key=key)
            )
    return problems


def ensure_calc_tool(
    train_path: str,
    eval_path: str,
    model_dir: str,
    spec: CalcToolSpec,
    model_cfg: Any,
    dry_run: bool = False,
    progress: bool = False,
) -> bool:
    """Write the rows and the base checkpoint unless the same ones are already there.

    Args:
        train_path: the training JSONL file (``task.path``).
        eval_path: the evaluation JSONL file (``task.eval_path``).
        model_dir: the checkpoint directory (``model.path``).
        spec: what to generate.
        model_cfg: the ``model`` section (sizes the checkpoint).
        dry_run: only say whether a run would write (``mode=plan``).
        progress: show the supervised steps' progress (``logging.progress``).

    Returns:
        True when something was (or, with ``dry_run``, would be) written.

    Raises:
        ConfigError: a path holds a checkpoint or data file this generator did not write.
    """
    paths = (train_path, eval_path)
    stamp = _stamp(spec, model_cfg, paths)
    return ensure_written(
        model_dir,
        current=lambda: _current(stamp, model_dir),
        foreign=lambda: foreign_outputs(paths, model_dir),
        write=lambda: _write_all(paths, model_dir, spec, model_cfg, stamp, progress),
        dry_run=dry_run,
    )


def _write_all(
    paths: tuple[str, str],
    model_dir: str,
    spec: CalcToolSpec,
    model_cfg: Any,
    stamp: Any,
    progress: bool,
) -> None:
    """Write the rows and the checkpoint (the caller holds the lock; the paths are ours)."""
    train, evals = sums(spec)
    for rows, path in ((train, paths[0]), (evals, paths[1])):
        _write_marked(rows, path)
    _write_checkpoint(model_dir, train, spec, model_cfg, stamp, progress)


def _write_marked(rows: list[dict[str, str]], path: str) -> None:
    """Write ``rows`` as JSON lines at ``path``, its mark first: stopped between the two, the
    mark does not match whatever is at ``path`` and proves nothing."""
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _replace(path + FILE_MARK_SUFFIX, json.dumps(_file_mark(text)).encode())
    _replace(path, text)


def _replace(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)  # readers never see a half-written file


def _write_checkpoint(
    model_dir: str,
    train: list[dict[str, str]],
    spec: CalcToolSpec,
    model_cfg: Any,
    stamp: Any,
    progress: bool,
) -> None:
    from rltrain.tasks.model import build_model
    from rltrain.tasks.tokenizer import build_char_tokenizer

    parent = os.path.dirname(os.path.abspath(model_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".calc-tool-", dir=parent)
    try:
        tok = build_char_tokenizer(ALPHABET)
        built = dataclasses.replace(model_cfg, path=None, tokenizer_path=None, dtype="float32")
        model = build_model(dataclasses.replace(built, vocab_chars=ALPHABET))
        losses = supervise(model, tok, train, spec, progress) if spec.sft_steps else []
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, STAMP), "w") as f:
            json.dump(stamp, f, indent=1)
        if os.path.lexists(model_dir):  # the generator's own (checked): replaced whole
            shutil.rmtree(model_dir)
        os.replace(tmp, model_dir)
        if losses:
            log.info(
                "calc_tool: base checkpoint supervised (loss %.3f -> %.3f)", losses[0], losses[-1]
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
