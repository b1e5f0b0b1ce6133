"""What a reward model reads (``reward.kind=model``): the row's conversation rendered by the
reward model's own tokenizer and chat template, cut on the right to its context, with the cut
rows counted. Real Hugging Face tokenizers and a real classifier, all built here."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.config.schema import RunConfig
from rltrain.tasks.gsm8k_tiny import CHAT_TEMPLATE, build_bpe_tokenizer
from rltrain.tasks.tokenizer import prompt_token_ids
from rltrain.workers.reward import ModelReward, PolicyRows, RewardModelWorker, Turns

#: The reward model's own template: unlike the policy's (ChatML), no generation prompt.
RM_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
CONTEXT = 24  # max_position_embeddings of the reward model: long rows are cut


def _reward_model(path: pathlib.Path, chat: bool = True, config_pad: str | None = None) -> None:
    """A random one-output Llama classifier over its own byte-level BPE tokenizer (its config's
    pad id that of ``config_pad`` when given, else the tokenizer's)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    corpus = ["What is 2+2? Be brief. 1+2=3 3+4=7 system user assistant"] * 4
    tok = build_bpe_tokenizer(corpus, vocab_size=300)
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    tok.add_special_tokens({"additional_special_tokens": ["<|system|>", "<|end|>"]})
    tok.chat_template = RM_TEMPLATE if chat else None
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        pad_token_id=tok.convert_tokens_to_ids(config_pad) if config_pad else tok.pad_token_id,
        num_labels=1,
    )
    torch.manual_seed(3)
    LlamaForSequenceClassification(config).save_pretrained(str(path))
    tok.save_pretrained(str(path))


def _batch(tokenizer, prompts: list[str], responses: list[list[int]]) -> RolloutBatch:
    """Rows as a rollout returns them: prompts left-padded, responses right-padded."""
    ids = prompt_token_ids(tokenizer, prompts)
    p, r = max(map(len, ids)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    return RolloutBatch(
        prompt_ids=torch.tensor([[pad] * (p - len(x)) + x for x in ids]),
        prompt_mask=torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in ids]),
        response_ids=torch.tensor([x + [pad] * (r - len(x)) for x in responses]),
        response_mask=torch.tensor([[1.0] * len(x) + [0.0] * (r - len(x)) for x in responses]),
    )


def _own_scores(path: pathlib.Path, rows: list[list[int]]) -> torch.Tensor:
    """The classifier's scores of each row alone (no padding anywhere)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([r])).logits[:, 0] for r in rows])


@pytest.fixture(scope="module")
def rm(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("rm")
    _reward_model(path)
    return path


def test_the_reward_model_reads_its_own_rendering_cut_to_its_context(rm) -> None:
    run = RunConfig()  # the arithmetic task, the character tokenizer (no chat template)
    run.reward.kind, run.reward.model_path = "model", str(rm)
    rows = PolicyRows(run)
    tok = rows.tokenizer
    three, seven = tok.convert_tokens_to_ids(["3", "7"])
    batch = _batch(tok, ["1+2=", "3+4="], [[three, tok.eos_token_id], [seven] * 30])
    turns = rows.turns(batch)
    assert turns[0] == Turns(
        ({"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}), "1+2=3"
    )
    scorer = ModelReward(str(rm), torch.device("cpu"), micro_batch=1)
    assert scorer.context == CONTEXT
    assert scorer.render(turns[0]) == "<|user|>1+2=<|end|><|assistant|>3<|end|>"
    long = "<|user|>3+4=<|end|><|assistant|>" + "7" * 30 + "<|end|>"
    assert scorer.render(turns[1]) == long
    full = [
        scorer.tokenizer(t, add_special_tokens=False)["input_ids"]
        for t in (scorer.render(turns[0]), long)
    ]
    assert len(full[0]) <= CONTEXT < len(full[1])
    ids, cut = scorer.encode(turns)
    assert ids == [full[0], full[1][:CONTEXT]] and cut == 1  # cut on the right
    scores, cut = scorer.score(turns)
    torch.testing.assert_close(scores, _own_scores(rm, ids), rtol=1e-5, atol=1e-5)
    assert cut == 1


def test_a_chat_policy_hands_over_its_messages_not_its_markup(rm, tmp_path) -> None:
    policy = build_bpe_tokenizer(["What is 2+2? 4 Be brief."] * 4, vocab_size=280)
    policy.chat_template = CHAT_TEMPLATE
    policy.save_pretrained(str(tmp_path / "policy"))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "What is 2+2?", "answer": "4"}) + "\n")
    run = RunConfig()
    run.model.tokenizer_path = str(tmp_path / "policy")
    run.task.name, run.task.path, run.task.num_eval = "jsonl", str(data), 0
    run.task.system_prompt = "Be brief."
    rows = PolicyRows(run)
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    rendered += "<|im_start|>assistant\n"
    answer = policy("4", add_special_tokens=False)["input_ids"] + [policy.eos_token_id]
    (turns,) = rows.turns(_batch(policy, [rendered], [answer]))
    assert turns.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    )
    assert turns.text == rendered + "4"  # as the policy saw it, for a template-less reward model
    scorer = ModelReward(str(rm), torch.device("cpu"), micro_batch=4)
    want = "<|system|>Be brief.<|end|><|user|>What is 2+2?<|end|><|assistant|>4<|end|>"
    assert scorer.render(turns) == want
    plain = tmp_path / "plain_rm"
    _reward_model(plain, chat=False)
    assert ModelReward(str(plain), torch.device("cpu"), 4).render(turns) == rendered + "4"


def test_the_worker_counts_the_rows_it_cut(rm) -> None:
    run = RunConfig()
    run.reward.kind, run.reward.model_path, run.reward.micro_batch_size = "model", str(rm), 2
    worker = RewardModelWorker(run)
    tok = worker.rows.tokenizer
    seven = tok.convert_tokens_to_ids("7")
    batch = _batch(
        tok, ["1+2=", "3+4=", "0+1="], [[seven] * 30, [seven, tok.eos_token_id], [seven] * 40]
    )
    batch = batch.replace(truncated=torch.tensor([True, False, True]))
    (scores,) = worker.score(batch)
    assert scores.counts == {"response/truncated": 2, "reward/truncated": 2}
    want = _own_scores(rm, worker.scorer.encode(worker.rows.turns(batch))[0])
    torch.testing.assert_close(scores.rewards, want, rtol=1e-5, atol=1e-5)


def test_rows_batched_together_score_as_alone_when_the_pad_ids_differ(tmp_path) -> None:
    # The classifier pools at each row's last token that is not its config's pad id; a
    # tokenizer whose own pad id differs must not pad with it, or a shorter row would be read
    # at a padding position (its score then depends on the row batched with it).
    _reward_model(tmp_path, config_pad="<|system|>")
    scorer = ModelReward(str(tmp_path), torch.device("cpu"), micro_batch=2)
    assert scorer.pad_id != scorer.tokenizer.pad_token_id
    rows = [
        Turns(({"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}), ""),
        Turns(({"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7777"}), ""),
    ]
    ids, _ = scorer.encode(rows)
    assert len(ids[0]) < len(ids[1])  # the first row is padded in the pair
    scores, _ = scorer.score(rows)
    torch.testing.assert_close(scores, _own_scores(tmp_path, ids), rtol=1e-5, atol=1e-5)
