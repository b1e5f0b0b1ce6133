"""Chat templates, message prompts, evaluation files and prompt lengths, with a real BPE
tokenizer saved and loaded in Hugging Face format."""

from __future__ import annotations

import json
import pathlib

import pytest

from rltrain.algorithms import encode_prompts
from rltrain.config.schema import ModelConfig, TaskConfig
from rltrain.errors import ConfigError
from rltrain.tasks import build_task, build_tokenizer, render_prompts, use_chat_template
from rltrain.tasks.gsm8k_tiny import build_bpe_tokenizer
from rltrain.tasks.tokenizer import load_tokenizer, prompt_token_ids

CORPUS = ["What is 6 times 7?", "The answer is 42.\n#### 42", "Name the colour of the sky."] * 20


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_bpe_tokenizer(CORPUS, 300).save_pretrained(str(path))
    return load_tokenizer(str(path))  # as a run loads it: from disk, through AutoTokenizer


def _cfg(**kw) -> TaskConfig:
    return TaskConfig(**kw)


def _jsonl(path: pathlib.Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_string_and_message_prompts_render_with_the_template(chat_tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = render_prompts(["What is 6 times 7?", msgs], chat_tok, True, system_prompt="Use ####.")
    assert out == [
        "<|im_start|>system\nUse ####.<|im_end|>\n<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n"
        "<|im_start|>assistant\n",
        # the row's own system message wins over task.system_prompt
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n",
    ]
    assert render_prompts(["plain"], chat_tok, False) == ["plain"]


def test_bad_message_rows_are_named(chat_tok):
    rows = [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        [{"role": "user"}],
        [],
        7,
    ]
    with pytest.raises(ConfigError) as info:
        render_prompts(rows, chat_tok, True, where=lambda i: f"line {i + 1}")
    p = info.value.problems
    assert "line 1: the last message is the assistant's" in p[0]
    assert "line 2: a message list must hold {role, content}" in p[1]
    assert "line 3: the prompt must be a string or a non-empty list" in p[2]
    assert "line 4: the prompt must be a string" in p[3] and len(p) == 4


def test_chat_template_setting_and_plain_text_limits(chat_tok):
    char_tok = build_tokenizer(ModelConfig())
    assert use_chat_template(None, chat_tok) and not use_chat_template(None, char_tok)
    assert not use_chat_template(False, chat_tok) and not use_chat_template(None, None)
    with pytest.raises(ConfigError, match="task.chat_template=true but the tokenizer.*has no chat"):
        use_chat_template(True, char_tok)
    with pytest.raises(ConfigError, match="line 2: the prompt is a list of messages but prompts"):
        render_prompts(
            ["a", [{"role": "user", "content": "b"}]], None, False, where=lambda i: f"line {i + 1}"
        )
    with pytest.raises(ConfigError, match="task.system_prompt='Be nice.' needs a chat template"):
        render_prompts(["a"], None, False, system_prompt="Be nice.")


def test_task_prompts_are_rendered_and_the_reward_finds_them_from_token_ids(chat_tok, tmp_path):
    rows = [
        {"question": "What is 6 times 7?", "answer": "The answer is 42.\n#### 42"},
        {"question": [{"role": "user", "content": "Name the colour of the sky."}], "answer": "1"},
    ]
    cfg = _cfg(
        name="jsonl",
        path=_jsonl(tmp_path / "d.jsonl", rows),
        prompt_key="question",
        reward_fn="rltrain.rewards.math:gsm8k",
        system_prompt="Use ####.",
    )
    task = build_task(cfg, chat_tok)
    prompt = task.train[0].prompt if "6 times" in task.train[0].prompt else task.train[1].prompt
    assert prompt.startswith("<|im_start|>system\nUse ####.<|im_end|>") and prompt.endswith(
        "assistant\n"
    )
    # the reward worker reads prompts back from token ids, without special tokens
    ids, _ = encode_prompts(chat_tok, [prompt])
    read_back = chat_tok.batch_decode(ids.tolist(), skip_special_tokens=True)[0]
    assert read_back != prompt and "<|im_start|>" not in read_back
    assert task.reward(read_back, "so #### 42") == 1.0 and task.reward(prompt, "#### 41") == 0.0
    assert task.answer(read_back) == "The answer is 42.\n#### 42"


def test_plain_prompts_need_no_alias(tmp_path):
    tok = build_tokenizer(ModelConfig())
    task = build_task(_cfg(name="arithmetic", max_operand=2), tok)
    assert task.aliases == {}


def test_eval_rows_come_from_their_own_file(chat_tok, tmp_path):
    train = _jsonl(tmp_path / "t.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(5)])
    evals = _jsonl(tmp_path / "e.jsonl", [{"prompt": "held out", "answer": "9"}])
    task = build_task(
        _cfg(name="jsonl", path=train, eval_path=evals, chat_template=False), chat_tok
    )
    assert len(task.train) == 5 and [e.prompt for e in task.eval] == ["held out"]
    assert not task.eval_is_train
    with pytest.raises(ConfigError, match="task.num_eval=2 with task.eval_path="):
        build_task(_cfg(name="jsonl", path=train, eval_path=evals, num_eval=2), chat_tok)
    clash = _jsonl(tmp_path / "c.jsonl", [{"prompt": "q1", "answer": "7"}])
    with pytest.raises(
        ConfigError, match=r"task.eval_path=.* line 1: prompt 'q1' appears with answers '1'"
    ):
        build_task(_cfg(name="jsonl", path=train, eval_path=clash, chat_template=False), chat_tok)


def test_prompts_over_max_prompt_length_are_refused_with_their_rows(chat_tok, tmp_path):
    rows = [{"prompt": "What is 6 times 7?" * k, "answer": "1"} for k in range(1, 10)]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    n = [
        len(r)
        for r in prompt_token_ids(
            chat_tok, render_prompts([r["prompt"] for r in rows], chat_tok, True)
        )
    ]
    limit = n[2]  # rows 0..2 fit, rows 3..8 do not
    with pytest.raises(ConfigError) as info:
        build_task(_cfg(name="jsonl", path=path, max_prompt_length=limit), chat_tok)
    p = info.value.problems
    want = f"line 4: the prompt is {n[3]} tokens (chat template applied), over "
    assert f"{want}task.max_prompt_length={limit}" in p[0]
    assert (
        len(p) == 6
        and "1 more prompts over task.max_prompt_length" in p[-1]
        and "(6 of 9)" in p[-1]
    )
    assert build_task(_cfg(name="jsonl", path=path, max_prompt_length=n[-1]), chat_tok)


def test_a_template_that_writes_the_bos_gets_no_second_one(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "a": 3, "b": 4}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    assert prompt_token_ids(tok, ["ab", "<s>ab"]) == [[0, 3, 4], [0, 3, 4]]
    ids, mask = encode_prompts(tok, ["<s>a", "b"])
    assert ids.tolist() == [[0, 3], [0, 4]] and mask.tolist() == [[1, 1], [1, 1]]


def test_fast_encoding_and_decoding_read_as_the_tokenizer_does(chat_tok):
    from rltrain.tasks.build import _decode_without_specials

    texts = render_prompts(["What is 6 times 7?", "Name the sky!"], chat_tok, True, "Be brief.")
    texts += ["plain text, no template", ""]
    for tok in (chat_tok, build_tokenizer(ModelConfig())):
        ids = prompt_token_ids(tok, texts)
        assert ids == [list(r) for r in tok(texts)["input_ids"]]
        want = tok.batch_decode(ids, skip_special_tokens=True)
        assert _decode_without_specials(tok, ids) == want


def test_prompts_the_tokenizer_reads_back_differently_are_found_too(tmp_path):
    # '?' is not in the built-in alphabet: it encodes as <unk>, which the reward worker's
    # read-back (special tokens skipped) drops, so the cheap reading is wrong here
    tok = build_tokenizer(ModelConfig())
    rows = [{"prompt": f"{i}+1=?", "answer": str(i + 1)} for i in range(3)]
    task = build_task(_cfg(name="jsonl", path=_jsonl(tmp_path / "d.jsonl", rows)), tok)
    ids, _ = encode_prompts(tok, ["2+1=?"])
    read_back = tok.batch_decode(ids.tolist(), skip_special_tokens=True)[0]
    assert read_back == "2+1=" and task.answer(read_back) == "3"
