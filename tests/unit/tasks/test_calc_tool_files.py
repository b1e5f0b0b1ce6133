"""``task.generate=calc_tool`` writes only where its stamp proves it wrote before."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from rltrain.config.schema import ModelConfig
from rltrain.errors import ConfigError
from rltrain.tasks.calc_tool import STAMP, CalcToolSpec, ensure_calc_tool

SPEC = CalcToolSpec(num_train=16, num_eval=4, sft_steps=0)
MODEL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=2)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _paths(d):
    return str(d / "train.jsonl"), str(d / "eval.jsonl"), str(d / "base_model")


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_users_data_file_is_refused_untouched(tmp_path, dry_run) -> None:
    train, evals, model = _paths(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"prompt": "mine", "answer": "1"}\n')
    before = _digest(tmp_path / "train.jsonl")
    with pytest.raises(ConfigError, match=r"task.path=.*did not write it.*task.generate=null"):
        ensure_calc_tool(train, evals, model, SPEC, MODEL, dry_run=dry_run)
    assert _digest(tmp_path / "train.jsonl") == before
    assert not (tmp_path / "base_model").exists() and not (tmp_path / "eval.jsonl").exists()


def test_a_users_checkpoint_is_refused_untouched(tmp_path) -> None:
    train, evals, model = _paths(tmp_path)
    (tmp_path / "base_model").mkdir()
    (tmp_path / "base_model" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"model.path=.*did not write it"):
        ensure_calc_tool(train, evals, model, SPEC, MODEL)
    assert (tmp_path / "base_model" / "config.json").read_text() == "{}"
    assert not (tmp_path / "train.jsonl").exists()


def test_its_own_outputs_are_kept_then_rewritten_for_another_spec(tmp_path) -> None:
    train, evals, model = _paths(tmp_path)
    assert ensure_calc_tool(train, evals, model, SPEC, MODEL, dry_run=True)
    assert not (tmp_path / "train.jsonl").exists()  # a plan writes nothing
    assert ensure_calc_tool(train, evals, model, SPEC, MODEL)
    stamp = json.loads((tmp_path / "base_model" / STAMP).read_text())
    assert sorted(stamp["data"]) == sorted([train, evals])
    assert not ensure_calc_tool(train, evals, model, SPEC, MODEL)  # current: kept
    more = CalcToolSpec(num_train=20, num_eval=4, sft_steps=0)
    assert ensure_calc_tool(train, evals, model, more, MODEL)  # its own files: rewritten
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 20
    # every model field the checkpoint is built from is in the stamp: a padded vocabulary is
    # a new checkpoint, not the cached one taken for it
    padded = dataclasses.replace(MODEL, vocab_size=64)
    assert ensure_calc_tool(train, evals, model, more, padded)
    assert json.loads((tmp_path / "base_model" / "config.json").read_text())["vocab_size"] == 64
    assert not ensure_calc_tool(train, evals, model, more, padded)


def test_the_warm_start_learns_the_call_and_the_answer_not_the_tools_result() -> None:
    from rltrain.tasks.calc_tool import ALPHABET, _sft_rows
    from rltrain.tasks.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(ALPHABET)
    [(prompt, response, trained)] = _sft_rows(tok, [{"prompt": "12+3=", "answer": "15"}])
    assert tok.decode(prompt) == "12+3="
    assert response[-1] == tok.eos_token_id and trained[-1]  # the model learns to stop
    text = tok.decode(response[:-1])
    assert text == "calculator[12+3]=15;15"
    shown = "".join(c for c, learned in zip(text, trained, strict=False) if not learned)
    assert shown == "=15;"  # the tool's reply: read, never learned


def test_its_data_files_are_rewritten_once_the_checkpoint_is_gone(tmp_path) -> None:
    import shutil

    train, evals, model = _paths(tmp_path)
    assert ensure_calc_tool(train, evals, model, SPEC, MODEL)
    # deleted, or never saved (a Ctrl-C during the supervised steps): the files stay its own
    shutil.rmtree(model)
    assert ensure_calc_tool(train, evals, model, SPEC, MODEL)
    assert (tmp_path / "base_model" / STAMP).is_file()
    assert not ensure_calc_tool(train, evals, model, SPEC, MODEL)


def test_a_data_file_edited_since_it_was_written_is_the_users(tmp_path) -> None:
    import shutil

    train, evals, model = _paths(tmp_path)
    assert ensure_calc_tool(train, evals, model, SPEC, MODEL)
    shutil.rmtree(model)
    with open(train, "a") as f:
        f.write('{"prompt": "1+1=", "answer": "2"}\n')
    before = _digest(tmp_path / "train.jsonl")
    with pytest.raises(ConfigError, match=r"task.path=.*did not write it.*task.generate=null"):
        ensure_calc_tool(train, evals, model, SPEC, MODEL)
    assert _digest(tmp_path / "train.jsonl") == before
