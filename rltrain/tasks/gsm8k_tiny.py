"""``task.generate=gsm8k_tiny``: a synthetic GSM8K-style data set and a small chat checkpoint.

``experiment=gsm8k_tiny`` runs the whole real-workload path on a CPU in minutes: a Parquet
data set with GSM8K's columns (``question``; ``answer`` = a worked solution ending in
``#### <number>``) and a base chat checkpoint in Hugging Face format, read back exactly as a
real data file and a real instruct checkpoint would be. The checkpoint is a small Llama/Qwen2
built from the ``model`` fields, with a byte-level BPE tokenizer trained on the problems with
the ``tokenizers`` library and a ChatML chat template, briefly supervised on worked solutions
(``task.params.sft_steps``): like a real instruct model it starts RL knowing the answer format
and some of the arithmetic, and RL raises its accuracy.

The problems are templated one-step word problems (adding or taking away small numbers, with
varying names, objects and phrasing). Everything is written once to the configured paths and
kept (a stamp records what was generated; other settings regenerate it).

With ``task.params.tool: true`` (``experiment=gsm8k_tool``) the worked solutions have the
Python tool of :class:`rltrain.tasks.python_tool.PythonEnv` do the arithmetic,
``python[38+47]=85;`` then ``#### 85``; the tokenizer is trained on that text and the checkpoint
is supervised on it with the tool's result (``=85;``) masked out of the loss, as ``calc_tool``
writes its demonstrations. The operands are then larger than the tiny model adds reliably
alone (``task.params.max_number``), so the tool is what makes it right.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from rltrain.config.schema import MODEL_SIZE_FIELDS
from rltrain.config.seeds import dataset_seed
from rltrain.tasks.generated import checked_spec, ensure_written, held_stamp
from rltrain.tasks.tool_format import format_call, format_result

log = logging.getLogger(__name__)

#: Bumped when the problems or the checkpoint recipe change, so old caches are rewritten
#: (it also seeds the problems).
VERSION = 2
STAMP = "generated_by_rltrain.json"

#: Special tokens: padding, and ChatML's turn markers (``<|im_end|>`` ends a response).
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

#: ChatML, as Qwen-style chat checkpoints use it (written for rltrain, not copied).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

NAMES = ("Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Ivy", "Jon", "Kim")
ITEMS = ("apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles")

#: (operation, question, solution): ``{n}`` name, ``{x}`` objects, ``{a}`` ``{b}`` operands.
TEMPLATES = (
    (
        "+",
        "{n} has {a} {x}. {n} buys {b} more {x}. How many {x} does {n} have now?",
        "{n} has {a} {x} and buys {b} more, so {a} + {b} = {c}.",
    ),
    (
        "+",
        "{n} finds {a} {x} in the morning and {b} {x} in the afternoon. "
        "How many {x} does {n} find in all?",
        "In all {n} finds {a} + {b} = {c} {x}.",
    ),
    (
        "+",
        "A box holds {a} {x}. {n} puts {b} more {x} in the box. How many {x} are in the box?",
        "The box holds {a} + {b} = {c} {x}.",
    ),
    (
        "-",
        "{n} has {a} {x} and gives {b} of them away. How many {x} does {n} have left?",
        "{n} has {a} - {b} = {c} {x} left.",
    ),
    (
        "-",
        "There are {a} {x} on a table. {n} takes {b} of them. How many {x} are on the table?",
        "{a} - {b} = {c} {x} are still on the table.",
    ),
    (
        "-",
        "{n} had {a} {x} and lost {b}. How many {x} does {n} have?",
        "{n} has {a} - {b} = {c} {x}.",
    ),
)


@dataclass(frozen=True)
class Gsm8kTinySpec:
    """What ``task.generate=gsm8k_tiny`` writes (``task.params`` keys of the same names).

    Attributes:
        num_train: training problems.
        num_eval: evaluation problems (no question of the training set).
        max_number: operands range over ``0..max_number`` (differences are never negative).
        vocab_size: BPE vocabulary size, the 256 byte symbols and special tokens included.
        sft_steps: supervised steps on the training solutions before the checkpoint is saved
            (0: the checkpoint keeps its random initialisation).
        sft_batch_size: solutions per supervised step.
        sft_lr: the supervised steps' AdamW learning rate.
        seed: which problems, in which order, and the supervised batches (``task.seed``).
        tool: the solutions call the ``python`` tool for their arithmetic
            (:func:`tool_solution`), for ``task.env=rltrain.tasks.python_tool:PythonEnv``.
    """

    num_train: int = 4000
    num_eval: int = 200
    max_number: int = 9
    vocab_size: int = 512
    sft_steps: int = 150
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    seed: int = 0
    tool: bool = False

    #: the ``task.generate`` value that writes it, for messages
    generator: ClassVar[str] = "gsm8k_tiny"

    @classmethod
    def from_params(cls, params: dict[str, Any], seed: int) -> Gsm8kTinySpec:
        """Read the spec from ``task.params``.

        Raises:
            ConfigError: a value of the wrong type or out of range.
        """
        return checked_spec(cls, params, seed)

    def problems(self) -> list[str]:
        """What is out of range, as messages naming ``task.params.*``."""
        out = []
        if self.num_train < 1:
            out.append(f"task.params.num_train={self.num_train} must be >= 1")
        if self.num_eval < 1:
            out.append(f"task.params.num_eval={self.num_eval} must be >= 1")
        if not 1 <= self.max_number <= 999:
            out.append(f"task.params.max_number={self.max_number} must be in 1..999")
        if self.sft_steps < 0 or self.sft_steps > 100_000:
            out.append(f"task.params.sft_steps={self.sft_steps} must be in 0..100000")
        if self.sft_batch_size < 1:
            out.append(f"task.params.sft_batch_size={self.sft_batch_size} must be >= 1")
        if not 0 < self.sft_lr <= 1:
            out.append(f"task.params.sft_lr={self.sft_lr} must be in (0, 1]")
        if self.vocab_size < 300:
            out.append(
                f"task.params.vocab_size={self.vocab_size} must be >= 300 (256 byte symbols, "
                f"special tokens, and merges)"
            )
        if not out and self.num_train + self.num_eval > self.capacity():
            out.append(
                f"task.params.num_train + num_eval = {self.num_train + self.num_eval} but "
                f"max_number={self.max_number} gives only {self.capacity()} distinct problems: "
                f"ask for fewer or raise task.params.max_number"
            )
        return out

    def capacity(self) -> int:
        """How many distinct problems the templates give."""
        m = self.max_number + 1
        per_op = {"+": m * m, "-": m * (m + 1) // 2}
        return sum(per_op[op] for op, _, _ in TEMPLATES) * len(NAMES) * len(ITEMS)


def word_problems(spec: Gsm8kTinySpec) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The training and evaluation problems, disjoint, deterministic in the spec.

    Args:
        spec: sizes and seed.

    Returns:
        ``(train, eval)`` lists of ``{"question", "answer"}`` rows; ``answer`` is a one-line
        solution, a newline, and ``#### <number>``.
    """
    rng = random.Random(dataset_seed(spec.seed, VERSION))
    r = range(spec.max_number + 1)
    combos = [
        (t, n, x, a, b)
        for t, (op, _, _) in enumerate(TEMPLATES)
        for n in range(len(NAMES))
        for x in range(len(ITEMS))
        for a in r
        for b in r
        if op == "+" or b <= a
    ]
    picked = rng.sample(combos, spec.num_train + spec.num_eval)
    rows = []
    for t, n, x, a, b in picked:
        op, question, solution = TEMPLATES[t]
        solution = tool_solution(op) if spec.tool else solution
        c = a + b if op == "+" else a - b
        words = {"n": NAMES[n], "x": ITEMS[x], "a": a, "b": b, "c": c}
        rows.append(
            {
                "question": question.format(**words),
                "answer": f"{solution.format(**words)}\n#### {c}",
            }
        )
    return rows[: spec.num_train], rows[spec.num_train :]


def tool_solution(op: str) -> str:
    """The solution template of a problem whose arithmetic the ``python`` tool does: the call
    and its result, ``python[{a}+{b}]={c};`` (the answer line follows). Nothing else to copy
    from the question: the tiny model learns to copy two operands in a few hundred steps."""
    return format_call("python", f"{{a}}{op}{{b}}") + format_result("{c}")


#: A tool's result in a solution (``=85;`` after a call's ``]``).
_RESULT = re.compile(r"(?<=\])(=[^;]*;)")


def solution_pieces(solution: str) -> list[tuple[str, bool]]:
    """A worked solution as ``(text, trained_on)`` pieces: the tool's results (written by
    the tool in a run, so never learned) apart from the model's own text.

    The pieces are tokenized one by one, as a run's trajectory is: the model's turn ends at the
    call's ``]`` and the result is tokenized apart, so no token spans the two.
    """
    parts = _RESULT.split(solution)
    return [(text, i % 2 == 0) for i, text in enumerate(parts) if text]


def _solution_ids(tok: Any, solution: str) -> tuple[list[int], list[bool]]:
    """A solution's token ids, its pieces tokenized apart, and whether each is trained on."""
    ids: list[int] = []
    keep: list[bool] = []
    for text, trained in solution_pieces(solution):
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        keep += [trained] * len(piece)
    return ids, keep


def build_bpe_tokenizer(corpus: Sequence[str], vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer with a ChatML chat template on ``corpus``.

    Byte-level: every byte is a base symbol, so any text encodes and nothing is unknown.

    Args:
        corpus: training texts.
        vocab_size: the vocabulary size, byte symbols and special tokens included.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``: ``<|im_end|>`` is its EOS (it ends an
        assistant turn), ``<|endoftext|>`` its padding, padding on the left.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=PAD,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


#: The ``model`` fields the generated checkpoint is built from (its stamp records them).
MODEL_FIELDS = ("family", *MODEL_SIZE_FIELDS, "vocab_size", "tie_word_embeddings", "init_seed")


def _stamp(
    spec: Gsm8kTinySpec,
    train_path: str,
    eval_path: str,
    model_cfg: Any,
    system_prompt: str | None,
    chat: bool,
) -> dict[str, Any]:
    return {
        "generator": "gsm8k_tiny",
        "version": VERSION,
        "spec": asdict(spec),
        "model": {k: getattr(model_cfg, k) for k in MODEL_FIELDS},
        "system_prompt": system_prompt,
        "chat_template": chat,
        "train_path": os.path.abspath(train_path),
        "eval_path": os.path.abspath(eval_path),
    }


#: Parquet schema metadata the generator writes into its data files: the proof, in the file
#: itself, that the generator wrote it (and so may rewrite it).
FILE_MARK = (b"rltrain.generator", b"gsm8k_tiny")


def _held_stamp(model_dir: str) -> dict[str, Any] | None:
    return held_stamp(model_dir, STAMP, "gsm8k_tiny")


def _marked(path: str) -> bool:
    """Whether ``path`` is a Parquet file carrying :data:`FILE_MARK`."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - not a Parquet file (or unreadable): not the generator's
        return False
    return meta.get(FILE_MARK[0]) == FILE_MARK[1]


def _file_is_ours(path: str, held: dict[str, Any] | None) -> bool:
    """Whether the generator wrote the data file at ``path``.

    Its own mark proves it; a file written before files were marked is proved by the stamp of
    the checkpoint written with it, which names its path.
    """
    if _marked(path):
        return True
    legacy = held is not None and held.get("version") == 1
    return legacy and os.path.abspath(path) in (held["train_path"], held["eval_path"])


def foreign_outputs(
    train_path: str, eval_path: str, model_dir: str, generate: str = "gsm8k_tiny"
) -> list[str]:
    """What the generator would overwrite without having written it: one message per path.

    The generator writes only where it wrote before: a checkpoint directory holding its stamp,
    data files holding its mark. Anything else already at one of its paths is the user's (a
    checkpoint, a data set) and is never replaced or deleted.

    Args:
        train_path: ``task.path``.
        eval_path: ``task.eval_path``.
        model_dir: ``model.path``.
        generate: the generator's name, for messages.

    Returns:
        Problem messages naming the key, the path and the fix; empty when every path is free or
        the generator's own.
    """

    def fix(key: str) -> str:
        return (
            f"set task.generate=null to use it as it is, or point {key} at a path that does not "
            f"exist yet (experiment=gsm8k_tiny puts all three under task.params.data_dir)"
        )

    problems = []
    held = _held_stamp(model_dir)
    if os.path.lexists(model_dir) and held is None:
        problems.append(
            f"model.path={model_dir!r} exists and task.generate={generate!r} did not write it (no "
            f"{STAMP} in it), so the generator will not replace it: " + fix("model.path")
        )
    for key, path in (("task.path", train_path), ("task.eval_path", eval_path)):
        if os.path.lexists(path) and not _file_is_ours(path, held):
            problems.append(
                f"{key}={path!r} exists and task.generate={generate!r} did not write it, so the "
                f"generator will not overwrite it: " + fix(key)
            )
    return problems


def _current(stamp: dict[str, Any], model_dir: str) -> bool:
    held = _held_stamp(model_dir)
    files = [stamp["train_path"], stamp["eval_path"]]
    return (
        held == stamp
        and os.path.isfile(os.path.join(model_dir, "config.json"))
        and all(os.path.isfile(f) and _marked(f) for f in files)
    )


def _write_parquet(rows: list[dict[str, str]], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".parquet", dir=directory)
    os.close(fd)
    try:
        table = pa.table({k: [r[k] for r in rows] for k in ("question", "answer")})
        pq.write_table(table.replace_schema_metadata(dict([FILE_MARK])), tmp)
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_base_model(
    directory: str,
    train: list[dict[str, str]],
    spec: Gsm8kTinySpec,
    model_cfg: Any,
    system_prompt: str | None,
    chat: bool,
    progress: bool = False,
) -> None:
    """Save the model the ``model`` fields describe into ``directory`` (which holds the
    tokenizer), supervised on ``train``'s worked solutions.

    The supervised prompts are rendered and tokenised by the tokenizer exactly as a run loads
    it from the finished directory: Transformers picks the tokenizer class from the model's
    ``config.json`` (a Qwen2 checkpoint's splits digits apart), so the model is saved first.
    Each solution is followed by EOS, so the model learns where to stop.
    """
    from transformers.utils import logging as hf_logging

    from rltrain.tasks.chat import render_prompts
    from rltrain.tasks.model import build_model
    from rltrain.tasks.sft import shown_steps, supervised_finetune
    from rltrain.tasks.tokenizer import build_tokenizer, prompt_token_ids

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one line in the run's log, not a bar per save
    try:
        built = dataclasses.replace(model_cfg, path=None, tokenizer_path=directory, dtype="float32")
        model = build_model(built)
        model.save_pretrained(directory)
        if not spec.sft_steps:
            return
        tok = build_tokenizer(dataclasses.replace(built, path=directory, tokenizer_path=None))
        prompts = render_prompts([r["question"] for r in train], tok, chat, system_prompt)
        responses = [_solution_ids(tok, r["answer"]) for r in train]
        pairs = [
            (p, [*r, tok.eos_token_id])
            for p, (r, _) in zip(prompt_token_ids(tok, prompts), responses, strict=True)
        ]
        label = "gsm8k_tiny: supervising the base checkpoint"
        log.info("%s (%d steps of %d solutions)", label, spec.sft_steps, spec.sft_batch_size)
        with shown_steps(label, spec.sft_steps, progress) as on_step:
            losses = supervised_finetune(
                model,
                pairs,
                tok.pad_token_id,
                spec.sft_steps,
                spec.sft_batch_size,
                spec.sft_lr,
                seed=spec.seed,
                on_step=on_step,
                trained=[[*keep, True] for _, keep in responses],  # EOS is learned
            )
        model.save_pretrained(directory)
        log.info(
            "gsm8k_tiny: base checkpoint supervised for %d steps (loss %.3f -> %.3f)",
            spec.sft_steps,
            losses[0],
            losses[-1],
        )
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def ensure_gsm8k_tiny(
    train_path: str,
    eval_path: str,
    model_dir: str,
    spec: Gsm8kTinySpec,
    model_cfg: Any,
    system_prompt: str | None = None,
    chat: bool = True,
    dry_run: bool = False,
    progress: bool = False,
) -> bool:
    """Write the data set and the base checkpoint unless the same ones are already there.

    Nothing is written or deleted at a path holding something the generator did not write
    (:func:`foreign_outputs`): that is refused before anything happens.

    Args:
        train_path: the training Parquet file (``task.path``).
        eval_path: the evaluation Parquet file (``task.eval_path``).
        model_dir: the checkpoint directory (``model.path``): model and tokenizer, in Hugging
            Face format.
        spec: what to generate.
        model_cfg: the ``model`` section; its :data:`MODEL_FIELDS` size the checkpoint.
        system_prompt: ``task.system_prompt``, rendered into the supervised prompts as into
            the run's.
        chat: whether the run renders prompts with the chat template (``task.chat_template``;
            the generated tokenizer has one), so the supervised prompts are rendered the same.
        dry_run: only check (``mode=plan``): write nothing, and say whether a run would write.
        progress: show the supervised steps' progress (``logging.progress``); each stage is
            logged either way.

    Returns:
        True when something was written (with ``dry_run``: would be), False when the cache was
        current.

    Raises:
        ConfigError: a path holds a checkpoint or file the generator did not write.
    """
    stamp = _stamp(spec, train_path, eval_path, model_cfg, system_prompt, chat)
    return ensure_written(
        model_dir,
        current=lambda: _current(stamp, model_dir),
        foreign=lambda: foreign_outputs(train_path, eval_path, model_dir),
        write=lambda: _generate(
            train_path, eval_path, model_dir, spec, model_cfg, system_prompt, chat, stamp, progress
        ),
        dry_run=dry_run,
    )


def _generate(
    train_path: str,
    eval_path: str,
    model_dir: str,
    spec: Gsm8kTinySpec,
    model_cfg: Any,
    system_prompt: str | None,
    chat: bool,
    stamp: dict[str, Any],
    progress: bool,
) -> None:
    """Write everything (the caller holds the lock and has checked the paths are ours)."""
    log.info(
        "gsm8k_tiny: writing %d training and %d evaluation problems", spec.num_train, spec.num_eval
    )
    train, evals = word_problems(spec)
    _write_parquet(train, train_path)
    _write_parquet(evals, eval_path)
    # the solutions in the pieces a run tokenizes apart: no merge across a call's end
    corpus = [
        text
        for r in train
        for text in (r["question"], *(t for t, _ in solution_pieces(r["answer"])))
    ]
    log.info("gsm8k_tiny: training a %d-token BPE tokenizer", spec.vocab_size)
    tok = build_bpe_tokenizer(corpus, spec.vocab_size)
    parent = os.path.dirname(os.path.abspath(model_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".checkpoint-", dir=parent)
    try:
        tok.save_pretrained(tmp)
        _write_base_model(tmp, train, spec, model_cfg, system_prompt, chat, progress)
        with open(os.path.join(tmp, STAMP), "w") as f:
            json.dump(stamp, f, indent=1)
        if os.path.lexists(model_dir):  # the generator's own (checked): replaced whole
            shutil.rmtree(model_dir)
        os.replace(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
