"""Every command and override the README and docs/ show does what they say.

Each ``python -m rltrain ...`` command in a code block is composed and put through the same
checks training makes before Ray starts (:func:`rltrain.runners.layout.preflight`, which is what
``mode=plan`` runs; ``placement=auto`` commands, which profile on a cluster first, are checked as
far as the config); a sweep is checked job by job. A command the docs print with an
``rltrain: error:`` line must be refused with that text. Overrides quoted inline in the prose
(`` `key=value` ``) must compose on the default config. Paths written ``/path/to/...`` stand for
the reader's files: the test puts small real ones in their place.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable

import pytest
from doc_commands import ROOT, DocCommand, all_commands, doc_files
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.errors import explain
from rltrain.config.store import register_configs

CONF = ROOT / "conf"
COMMANDS = all_commands()
RUNS = [c for c in COMMANDS if c.is_run]


def compose_config(overrides: list[str]):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    """Generated data sets (experiment=gsm8k_tiny) go to a temporary cache, not ~/.cache."""
    monkeypatch.setenv("RLTRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory) -> dict[str, Callable[[str], str]]:
    """``/path/to/...`` stand-ins: config key -> a function making a real file or directory."""
    root = tmp_path_factory.mktemp("reader")

    def checkpoint(placeholder: str) -> str:
        """A small chat checkpoint: a Qwen2 and a byte-level BPE tokenizer with a template."""
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from rltrain.tasks.gsm8k_tiny import build_bpe_tokenizer

        path = root / "checkpoint"
        if not path.exists():
            corpus = [f"{r['question']} {r['solution']}" for r in rows()]
            tok = build_bpe_tokenizer(corpus, vocab_size=320)
            config = Qwen2Config(
                vocab_size=len(tok),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                max_position_embeddings=1024,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            Qwen2ForCausalLM(config).save_pretrained(path)
            tok.save_pretrained(path)
        return str(path)

    def rows() -> list[dict]:
        # the field names the docs use for a reader's data set
        return [
            {
                "prompt": f"{a}+{b}=",
                "answer": str(a + b),
                "question": f"{a}+{b}=",
                "solution": str(a + b),
            }
            for a in range(20)
            for b in range(20)
        ]

    def data_file(placeholder: str) -> str:
        if placeholder.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            path = root / "data.parquet"
            pq.write_table(pa.Table.from_pylist(rows()), path)
        else:
            import json

            path = root / "data.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows()))
        return str(path)

    def directory(placeholder: str) -> str:
        return str(root)

    return {
        "model.path": checkpoint,
        "model.tokenizer_path": checkpoint,
        "reward.model_path": checkpoint,
        "task.path": data_file,
        "task.eval_path": data_file,
        "trainer.checkpoint_dir": directory,
    }


def _fill(overrides: list[str], placeholders: dict[str, Callable[[str], str]]) -> list[str]:
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+") == "cluster.address":
            value = re.sub(r"<[^>]+>", "127.0.0.1", value)  # planning never connects
        if "/path/to/" in value:
            make = placeholders.get(key.lstrip("+"))
            assert make is not None, f"add a stand-in for {key}=/path/to/... to this test"
            value = make(value)
        out.append(f"{key}={value}")
    return out


def _refusal(overrides: list[str], tmp_path: pathlib.Path) -> str | None:
    """What rltrain says about these overrides before Ray starts; None when it accepts them."""
    from rltrain.runners.layout import preflight

    try:
        run = load_config(compose_config(overrides))
        if run.placement.mode != "auto":  # auto profiles on the cluster: its own tests
            preflight(run, str(tmp_path))
    except Exception as exc:  # noqa: BLE001 - classified by explain, as the CLI does
        message = explain(exc)
        if message is None:
            raise
        return message
    return None


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("command", RUNS, ids=[c.where for c in RUNS])
def test_documented_command(command: DocCommand, placeholders, tmp_path):
    for overrides in command.override_sets():
        refusal = _refusal(_fill(overrides, placeholders), tmp_path)
        if command.expect_error is None:
            assert refusal is None, f"{command.where}: {' '.join(overrides)} -> {refusal}"
        else:
            shown = _squash(command.expect_error.split("...")[0]).strip()
            assert refusal is not None, f"{command.where} is shown failing but runs"
            assert shown in _squash(refusal), f"{command.where}: {refusal}"


def test_documented_bench_measures_exist():
    from rltrain.bench.harness import discover

    known = set(discover())
    for c in COMMANDS:
        if c.args and c.args[0] == "bench":
            names = [a for a in c.args[1:] if not a.startswith("-") and "=" not in a]
            names = [n for n in names if not re.fullmatch(r"[\d.:]+|MD", n)]
            assert set(names) <= known, f"{c.where}: unknown measures {set(names) - known}"


#: An override quoted in prose: a dotted key (or a group) and a value, nothing else.
INLINE = re.compile(r"`(\+{0,2}[a-z_]+(?:\.[a-z_0-9]+)+=[^`]+)`")


def _inline_overrides() -> list[tuple[str, str]]:
    found = []
    for path in doc_files():
        in_block = False
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
            elif not in_block:
                found += [(f"{path.relative_to(ROOT)}:{i}", m) for m in INLINE.findall(line)]
    return found


INLINE_OVERRIDES = _inline_overrides()


@pytest.mark.parametrize(
    ("where", "override"), INLINE_OVERRIDES, ids=[w for w, _ in INLINE_OVERRIDES]
)
def test_documented_override_composes(where: str, override: str, placeholders):
    key, _, value = override.partition("=")
    if "<" in value or "..." in value or re.fullmatch(r"[A-Za-z]", value):
        pytest.skip("a pattern (<x>, ..., or a single letter), not a value")
    if key.startswith("hydra."):
        pytest.skip("Hydra's own key: Hydra checks it")
    try:
        load_config(compose_config(_fill([override], placeholders)))
    except Exception as exc:  # noqa: BLE001
        message = explain(exc) or repr(exc)
        # Cross-field checks may need the rest of a documented command; the override itself
        # must exist, take its value's type and need no extra `+`.
        bad_key = ("unknown config key", "Could not override", "bad value for", "could not read")
        assert not any(b in message for b in bad_key), f"{where}: {override} -> {message}"


def test_the_docs_show_commands():
    assert len(RUNS) >= 20 and len(INLINE_OVERRIDES) >= 10
