"""Reading a task's rows from local files with Hugging Face ``datasets``, with clear errors.

Formats: ``.jsonl`` (one JSON object per line), ``.json`` (an array of objects, or JSON lines),
``.parquet``, and a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.
Everything is local: the hub is never asked (``HF_DATASETS_OFFLINE=1`` unless the caller set it).

Every problem names the config key, the file, the line (JSONL) or row, the field and the fix; a
file ``datasets`` cannot read is diagnosed again line by line so a malformed line, a binary file
or an empty file gets its own message instead of the library's generic one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rltrain.errors import ConfigError

#: File types ``task.path`` / ``task.eval_path`` accept, as error messages list them.
SUPPORTED = ".jsonl, .json, .parquet, or a directory saved with datasets' save_to_disk"

#: How many bad rows a message lists before it only counts the rest.
MAX_LISTED = 5

#: The most digits an integral JSON answer written with a fraction or exponent (``1e3``) is
#: spelled out with; a longer one keeps the file's spelling.
MAX_INTEGER_DIGITS = 1000

#: Message roles a prompt may hold: the ones chat templates render (a template given another
#: role drops it, or renders text the model never saw in training).
ROLES = ("system", "user", "assistant", "tool")

#: A ``DatasetDict`` directory's split read for each key, in order of preference.
SPLITS = {"task.path": ("train",), "task.eval_path": ("test", "validation", "eval")}


@dataclass(frozen=True)
class Rows:
    """The prompt and answer fields of every row of one dataset, in file order.

    Attributes:
        path: the file or directory.
        key: the config key that named it (``task.path`` or ``task.eval_path``).
        prompts: each row's prompt field: a string or a list of ``{role, content}`` messages.
        answers: each row's answer field as text.
        jsonl: True for a JSON-lines file (positions are reported as line numbers).
    """

    path: str
    key: str
    prompts: list[Any]
    answers: list[str]
    jsonl: bool = False
    _lines: list[int] = field(default_factory=list, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.prompts)

    def where(self, i: int) -> str:
        """Where row ``i`` is, for messages: ``task.path='d.jsonl' line 7`` or ``... row 6``."""
        if self.jsonl:
            if not self._lines:
                self._lines.extend(_content_lines(self.path))
            if i < len(self._lines):
                return f"{self.key}={self.path!r} line {self._lines[i]}"
        return f"{self.key}={self.path!r} row {i}"


def _content_lines(path: str) -> Iterator[int]:
    """Line numbers (1-based) of a JSON-lines file's non-blank lines: row i is on the i-th."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno


def _import_datasets(path: str, key: str) -> Any:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only, never the hub
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            f"{key}={path!r} is read with Hugging Face datasets and pyarrow, which cannot be "
            f"imported ({exc}): pip install datasets pyarrow (rltrain's own dependencies)"
        ) from None
    return datasets


@contextlib.contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """No progress bars and no library error lines while loading: our messages say it all."""
    bars = datasets.is_progress_bar_enabled()
    logger = logging.getLogger("datasets")
    level = logger.level
    datasets.disable_progress_bars()
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def file_kind(path: str, key: str = "task.path") -> str:
    """The loader a path needs: ``json``, ``parquet`` or ``disk``.

    Raises:
        ConfigError: the path does not exist or has an unsupported suffix.
    """
    if os.path.isdir(path):
        return "disk"
    if not os.path.exists(path):
        raise ConfigError(f"{key}={path!r} does not exist: give a local {SUPPORTED}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".jsonl", ".json"):
        return "json"
    if suffix == ".parquet":
        return "parquet"
    raise ConfigError(
        f"{key}={path!r}: {suffix or 'a file without a suffix'} is not a supported dataset "
        f"type; use {SUPPORTED} (e.g. convert with datasets.load_dataset('csv', data_files=...)"
        f"['train'].to_parquet('data.parquet'))"
    )


def load_table(path: str, key: str = "task.path") -> Any:
    """Open a local dataset as a ``datasets.Dataset`` (in memory; no cache left behind).

    Args:
        path: a ``.jsonl`` / ``.json`` / ``.parquet`` file or a ``save_to_disk`` directory.
        key: the config key that named the path, for messages.

    Returns:
        The dataset; for a ``DatasetDict`` directory, the split :data:`SPLITS` picks for ``key``.

    Raises:
        ConfigError: missing path, unsupported type, an empty, binary or malformed file, a
            directory that is no saved dataset, or a ``DatasetDict`` without a usable split.
    """
    kind = file_kind(path, key)
    if kind != "disk" and os.path.getsize(path) == 0:
        raise ConfigError(f"{key}={path!r} is empty: it holds no rows")
    datasets = _import_datasets(path, key)
    with _quiet(datasets):
        if kind == "disk":
            return _pick_split(_load_from_disk(datasets, path, key), path, key)
        # The prepared Arrow file goes to a scratch cache removed right after: the rows stay in
        # memory, and nothing accumulates under ~/.cache from every file a run or test reads.
        scratch = tempfile.mkdtemp(prefix="rltrain-datasets-")
        try:
            return datasets.load_dataset(
                kind,
                data_files=os.path.abspath(path),
                split="train",
                cache_dir=scratch,
                keep_in_memory=True,
            )
        except Exception as exc:  # noqa: BLE001 - every loader failure is explained below
            raise ConfigError(_explain_failure(path, key, kind, exc)) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _load_from_disk(datasets: Any, path: str, key: str) -> Any:
    try:
        return datasets.load_from_disk(path, keep_in_memory=True)
    except FileNotFoundError:
        raise ConfigError(
            f"{key}={path!r} is a directory but not one written by datasets' save_to_disk (no "
            f"dataset_info.json / dataset_dict.json): point {key} at a {SUPPORTED}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a damaged save: say which and why
        raise ConfigError(
            f"{key}={path!r}: datasets.load_from_disk failed ({type(exc).__name__}: {exc}); "
            f"save the dataset again with save_to_disk"
        ) from None


def _pick_split(loaded: Any, path: str, key: str) -> Any:
    splits = getattr(loaded, "keys", None)
    if splits is None:
        return loaded  # a single Dataset
    names = list(loaded.keys())
    if names == ["train"] and key == "task.eval_path":
        # taken as it is, it would score the training rows as held-out ones
        raise ConfigError(
            f"{key}={path!r} is a DatasetDict whose only split is 'train', not held-out rows: "
            f"point {key} at a dataset of evaluation rows (a DatasetDict split named test, "
            f"validation or eval, or a split saved on its own), or set {key}=null and "
            f"task.num_eval to hold prompts out of task.path"
        )
    if len(names) == 1:
        return loaded[names[0]]
    for name in SPLITS.get(key, ()):
        if name in loaded:
            return loaded[name]
    raise ConfigError(
        f"{key}={path!r} is a DatasetDict with splits {names} and none of "
        f"{list(SPLITS.get(key, ()))}: save the split you mean on its own "
        f"(dataset_dict['<split>'].save_to_disk(dir)) and point {key} at it"
    )


def _explain_failure(path: str, key: str, kind: str, exc: Exception) -> str:
    """Why ``datasets`` could not read a file, as precisely as a second look can tell."""
    cause = exc.__cause__ or exc.__context__ or exc
    detail = f"{type(cause).__name__}: {cause}".strip().rstrip(":")
    if kind == "parquet":
        if _parquet_rows(path) == 0:
            return f"{key}={path!r} holds no rows: give a file with at least one row"
        return (
            f"{key}={path!r} is not a readable Parquet file ({detail}); write it with "
            f"pandas.DataFrame.to_parquet or datasets' Dataset.to_parquet"
        )
    return _diagnose_json(path, key) or (
        f"{key}={path!r} could not be read as JSON rows ({detail}): every row must be an object "
        f"and a field must hold the same type in every row (e.g. the prompt always a string, "
        f"or always a list of messages)"
    )


def _parquet_rows(path: str) -> int | None:
    """The row count a Parquet file's footer records, or None when it cannot be read."""
    try:
        import pyarrow.parquet as pq

        return int(pq.read_metadata(path).num_rows)
    except Exception:  # noqa: BLE001 - not Parquet at all: the caller says so
        return None


def _diagnose_json(path: str, key: str) -> str | None:
    """The first concrete fault of a JSON or JSON-lines file, or None if none is found."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"{key}={path!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}): is it a binary file? Give a {SUPPORTED}"
        )
    text = text.removeprefix("\ufeff")  # a byte-order mark, which the loader accepts
    if "\x00" in text:
        return f"{key}={path!r} holds NUL bytes, so it is not JSON text: is it a binary file?"
    if not text.strip():
        return f"{key}={path!r} holds only whitespace: it has no rows"
    if text.lstrip().startswith("["):  # one JSON array
        return _diagnose_json_array(path, key, text)
    return _diagnose_json_lines(path, key, text)


def _diagnose_json_array(path: str, key: str, text: str) -> str | None:
    """The first fault of a file holding one JSON array, or None."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{key}={path!r} line {exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})"
    if isinstance(data, list) and not data:
        return f"{key}={path!r} is an empty JSON array: it holds no rows"
    bad = next((i for i, r in enumerate(data) if not isinstance(r, dict)), None)
    if bad is not None:
        return (
            f"{key}={path!r} row {bad}: expected a JSON object with the prompt and answer "
            f"fields, got {type(data[bad]).__name__}"
        )
    # the array loader also refuses integers beyond 64 bits
    huge = ((i, _huge_number(r, 2**64)) for i, r in enumerate(data))
    return next((_huge_message(path, key, f"row {i}", h) for i, h in huge if h), None)


def _diagnose_json_lines(path: str, key: str, text: str) -> str | None:
    """The first fault of a JSON-lines file, or None."""
    first_type: dict[str, tuple[str, int]] = {}
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            return (
                f"{key}={path!r} line {lineno}: not valid JSON ({exc.msg}, column {exc.colno}); "
                f"a .jsonl file holds one JSON object per line"
            )
        if not isinstance(record, dict):
            return (
                f"{key}={path!r} line {lineno}: expected a JSON object with the prompt and "
                f"answer fields, got {type(record).__name__}"
            )
        if huge := _huge_number(record):
            return _huge_message(path, key, f"line {lineno}", huge)
        for name, value in record.items():
            if value is None:
                continue
            kind = _JSON_TYPES.get(type(value), type(value).__name__)
            seen = first_type.setdefault(name, (kind, lineno))
            if seen[0] != kind:
                return (
                    f"{key}={path!r} line {lineno}: field {name!r} holds {kind} here but "
                    f"{seen[0]} on line {seen[1]}: give it one type in every row"
                )
    return None


def _huge_number(record: dict, int_limit: float = math.inf) -> tuple[str, str] | None:
    """The first top-level field of ``record`` holding a number the loader cannot read, with the
    number: beyond a float64 (Python reads ``1e400`` as infinity), or an integer of at least
    ``int_limit`` in magnitude."""
    for name, value in record.items():
        if isinstance(value, float) and math.isinf(value):
            return name, "a number beyond a float64's range"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= int_limit:
            return name, f"a {abs(value).bit_length()}-bit integer"
    return None


def _huge_message(path: str, key: str, where: str, huge: tuple[str, str]) -> str:
    name, what = huge
    return (
        f"{key}={path!r} {where}: field {name!r} holds {what}, which the loader cannot read: "
        f'quote it ("{name}": "...") to keep it as text'
    )


_JSON_TYPES = {str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_JSON_TYPES.update({list: "a list", dict: "an object"})


def _column(table: Any, name: str) -> list[Any] | None:
    """A field's values in row order, decoded by the dataset's features (a field that holds
    strings in some rows and message lists in others is typed ``Json`` and comes back as
    both); ``a.b`` reads field ``b`` of struct column ``a``."""
    columns = table.column_names
    if name in columns:
        return table.select_columns([name])[:][name]
    head, _, rest = name.partition(".")
    if not rest or head not in columns:
        return None
    return [_field(value, rest) for value in table.select_columns([head])[:][head]]


def _field(value: Any, dotted: str) -> Any:
    """Field ``dotted`` (``b`` or ``b.c``) of a nested record; None where a level is missing."""
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _listed(bad: Sequence[int], rows: Rows, text: str) -> list[str]:
    out = [f"{rows.where(i)}: {text}" for i in bad[:MAX_LISTED]]
    if len(bad) > MAX_LISTED:
        out.append(f"{rows.key}={rows.path!r}: {len(bad) - MAX_LISTED} more rows like these")
    return out


def read_rows(
    path: str, prompt_key: str = "prompt", answer_key: str = "answer", key: str = "task.path"
) -> Rows:
    """Read every row's prompt and answer field.

    Args:
        path: a ``.jsonl`` / ``.json`` / ``.parquet`` file or a ``save_to_disk`` directory.
        prompt_key: the field holding the prompt (``task.prompt_key``); ``a.b`` reads a nested
            field.
        answer_key: the field holding the reference answer (``task.answer_key``).
        key: the config key that named the path.

    Returns:
        The rows; answers are converted to text (a number ``72`` becomes ``"72"``).

    Raises:
        ConfigError: see :func:`load_table`; also no rows, a field missing from the file or
            from some rows (file, line or row, field; a NaN answer is a missing one), or an
            answer that is a list, an object or a boolean.
    """
    table = load_table(path, key)
    if len(table) == 0:
        raise ConfigError(f"{key}={path!r} holds no rows")
    fields = {}
    for name, cfg_key in ((prompt_key, "task.prompt_key"), (answer_key, "task.answer_key")):
        try:
            values = _column(table, name)
        except UnicodeDecodeError as exc:  # Arrow keeps a string's bytes unchecked until read
            found = _diagnose_json(path, key) if file_kind(path, key) == "json" else None
            raise ConfigError(
                found
                or f"{key}={path!r}: field {name!r} holds text that is not UTF-8 ({exc.reason}, "
                f"byte 0x{exc.object[exc.start]:02x}): save the data as UTF-8"
            ) from None
        if values is None:
            raise ConfigError(
                f"{key}={path!r} has no field {name!r} ({cfg_key}={name!r}); its fields are "
                f"{table.column_names}: set {cfg_key} to the field that holds it"
            )
        fields[name] = values
    prompts, raw_answers = fields[prompt_key], fields[answer_key]
    if file_kind(path, key) == "json" and any(a is None or _is_number(a) for a in raw_answers):
        # Arrow reads a JSON number as int64 or float64: a 20-digit answer, or an int beside a
        # float, comes back rounded, and one beyond a float64 (1e400) as null. The file's own
        # digits are the reference answer.
        raw_answers = _exact_json_answers(path, answer_key, len(raw_answers)) or raw_answers
    rows = Rows(path, key, prompts, [], jsonl=_is_json_lines(path))
    problems = []
    for name, values, cfg_key in (
        (prompt_key, prompts, "task.prompt_key"),
        (answer_key, raw_answers, "task.answer_key"),
    ):
        # NaN: a float column's missing value (pyarrow writes it as such)
        missing = [i for i, v in enumerate(values) if v is None or _is_nan(v)]
        problems += _listed(
            missing,
            rows,
            f"missing field {name!r} ({cfg_key}={name!r}): give every row the field, or drop "
            f"the row",
        )
    odd_prompts = [
        i for i, p in enumerate(prompts) if p is not None and not isinstance(p, (str, list, tuple))
    ]
    if odd_prompts:
        problems += _listed(
            odd_prompts,
            rows,
            f"the prompt field {prompt_key!r} holds {_kind(prompts[odd_prompts[0]])} (first of "
            f"these rows): a prompt must be a string or a list of {{role, content}} messages; "
            f"quote it",
        )
    not_messages = [i for i, p in enumerate(prompts) if _not_messages(p)]
    problems += _listed(
        not_messages,
        rows,
        f"the prompt field {prompt_key!r} is a list but not of {{role, content}} messages with "
        f'string values: give a string, or messages such as [{{"role": "user", "content": '
        f'"..."}}]',
    )
    odd = [i for i, a in enumerate(raw_answers) if isinstance(a, (list, dict))]
    problems += _listed(
        odd, rows, f"the answer field {answer_key!r} holds a list or object: give a string"
    )
    # Python would spell it True, which no response in the file's spelling (true) matches
    odd = [i for i, a in enumerate(raw_answers) if isinstance(a, bool)]
    problems += _listed(
        odd,
        rows,
        f"the answer field {answer_key!r} holds a boolean, neither text nor a number: give it "
        f"as text the responses should spell (quoted in JSON; a string column in Parquet or a "
        f"saved dataset)",
    )
    empty_prompts = [i for i, p in enumerate(prompts) if p is not None and _blank_prompt(p)]
    problems += _listed(
        empty_prompts,
        rows,
        f"the prompt ({prompt_key!r}) is empty: there is nothing to answer; give every row a "
        f"prompt, or drop the row",
    )
    odd_roles = [i for i, p in enumerate(prompts) if _unknown_roles(p)]
    problems += [
        f"{rows.where(i)}: message roles {_unknown_roles(prompts[i])} are not ones a chat "
        f"template renders: use {list(ROLES)}"
        for i in odd_roles[:MAX_LISTED]
    ]
    if len(odd_roles) > MAX_LISTED:
        problems.append(f"{key}={path!r}: {len(odd_roles) - MAX_LISTED} more rows like these")
    empty_answers = [i for i, a in enumerate(raw_answers) if isinstance(a, str) and not a.strip()]
    problems += _listed(
        empty_answers,
        rows,
        f"the answer ({answer_key!r}) is empty: no response could be scored right against it; "
        f"give every row its reference answer, or drop the row",
    )
    if problems:
        raise ConfigError(problems)
    rows.answers.extend(_answer_text(a) for a in raw_answers)
    return rows


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _exact_json_answers(path: str, answer_key: str, n: int) -> list[Any] | None:
    """Each row's answer field as a JSON or JSON-lines file spells it: a number comes back as
    an ``int`` or, with a fraction or exponent, as its text (:class:`_JsonNumber`), anything
    else as parsed.

    Returns:
        ``n`` answers in row order, or None when the file's rows do not line up with ``n``.
    """
    # utf-8-sig: a byte-order mark, which the loader accepts; lines split at "\n" only, as the
    # loader splits them (str.splitlines also breaks at U+2028, legal inside a JSON string)
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    parse = {"parse_int": int, "parse_float": _JsonNumber}
    try:
        if text.lstrip().startswith("["):
            records = json.loads(text, **parse)
        else:
            records = [json.loads(line, **parse) for line in text.split("\n") if line.strip()]
    except ValueError:
        return None  # not as the loader read it: keep the loader's values
    if len(records) != n:
        return None
    # a top-level key as written, else a nested field ``a.b`` as :func:`_column` reads it
    return [r[answer_key] if answer_key in r else _field(r, answer_key) for r in records]


def _kind(value: Any) -> str:
    """A JSON value's kind as messages name it (``a number``)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _unknown_roles(prompt: Any) -> list[str]:
    """The roles of a message-list prompt that are not in :data:`ROLES`."""
    if not isinstance(prompt, (list, tuple)):
        return []
    roles = [m.get("role") for m in prompt if isinstance(m, dict)]
    return [r for r in roles if isinstance(r, str) and r not in ROLES]


def _not_messages(prompt: Any) -> bool:
    """A list prompt holding something other than ``{role, content}`` messages with string
    values (``["1+1=", "x"]``)."""
    if not isinstance(prompt, (list, tuple)):
        return False
    return not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )


def _blank_prompt(prompt: Any) -> bool:
    """A prompt with no text: an empty string, or messages whose contents are all empty."""
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, (list, tuple)) and not _not_messages(prompt):
        contents = [m.get("content") for m in prompt if isinstance(m, dict)]
        return all(isinstance(c, str) and not c.strip() for c in contents)
    return False


def _is_json_lines(path: str) -> bool:
    """Whether rows of a file are its non-blank lines (``.jsonl``, or a ``.json`` that is not
    one array), so positions are reported as line numbers."""
    lower = path.lower()
    if lower.endswith(".jsonl"):
        return True
    if not lower.endswith(".json"):
        return False
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return not head.startswith(b"[")


class _JsonNumber(str):
    """A JSON number with a fraction or an exponent, as the file spells it (``1e-7``)."""


def _answer_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a numeric column read as float64: 72.0 is the answer 72
    if isinstance(value, _JsonNumber):
        exact = Decimal(value).to_integral_value()
        # a JSON 72.0 or 1e3 is the answer 72 or 1000, as above; 1e999999999 stays as written
        # rather than become a billion digits
        if exact == Decimal(value) and exact.adjusted() < MAX_INTEGER_DIGITS:
            return format(exact.copy_abs() if exact.is_zero() else exact, "f")
    return str(value)
