"""``long_generation``: rltrain's sampling loop against Hugging Face ``generate``, same model.

A small Qwen2 (hidden 256, 4 layers, vocabulary 512, random weights) samples ``n=8`` responses to
4 prompts of 32 tokens (32 rows) at response budgets of 16, 128 and 512 tokens, temperature 1,
no top-k or top-p, in one process. Its EOS logit gets a fixed bias so a row stops with
probability ``4 / budget`` per token: response lengths spread like real ones (many short, a long
tail), about a quarter of the budget on average, so most rows finish long before the batch
does. Both loops stop every row at EOS; rltrain's also drops finished rows from the decoding
batch and the KV cache (:data:`rltrain.algorithms.sampling.COMPACT_SHARE`), ``generate`` keeps
decoding them as padding until the longest row ends. A third case runs rltrain's loop with
finished rows kept, to separate the gain of dropping them from the rest of the loop's.

Throughput counts the tokens of the responses (EOS included, padding not), per second. Every
call samples the same tokens (fixed seeds), so a case's work is the same at every repeat; the
two loops draw from different random streams, so their lengths differ a little (the extras give
each case's mean response length).
"""

from __future__ import annotations

import math

from rltrain.bench.harness import Case, Suite, measure

VOCAB, HIDDEN, LAYERS, HEADS = 512, 256, 4, 4
PROMPTS, PROMPT_LEN, N = 4, 32, 8
EOS, PAD = 1, 0
THREADS = 1


def _model(max_len: int):
    """A small random Qwen2 and its EOS-biased output layer (shared by both loops)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=max_len,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=EOS,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        head = torch.nn.Linear(HIDDEN, VOCAB, bias=True)
        head.weight.data.copy_(model.lm_head.weight.data)
        head.bias.data.zero_()
    model.lm_head = head
    model.requires_grad_(False)
    return model


def _stop_bias(model, budget: int) -> None:
    """Set the EOS bias so P(EOS) ~ 4 / budget per token (random-init logits are near 0)."""
    p = min(4.0 / budget, 0.5)
    model.lm_head.bias.data[EOS] = math.log(p * (VOCAB - 1) / (1 - p))


def _prompts():
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (PROMPTS, PROMPT_LEN), generator=g)
    return ids, torch.ones_like(ids)


def _ours(model, budget: int, compact: bool = True):
    import torch

    from rltrain.algorithms import sampling

    ids, mask = _prompts()
    params = sampling.SamplingParams(max_new_tokens=budget, temperature=1.0, n=N)
    # 2.0: a share finished rows never reach, so they stay in the batch (the loop without
    # compaction, to tell its gain from the rest of the loop's)
    share = sampling.COMPACT_SHARE if compact else 2.0

    def run() -> int:
        default, sampling.COMPACT_SHARE = sampling.COMPACT_SHARE, share
        try:
            g = torch.Generator().manual_seed(2)
            batch = sampling.generate(model, ids, mask, params, EOS, PAD, g)
        finally:
            sampling.COMPACT_SHARE = default
        return int(batch.response_mask.sum())

    return run


def _ours_keeping_rows(model, budget: int):
    return _ours(model, budget, compact=False)


def _hf(model, budget: int):
    import torch

    ids, mask = _prompts()

    def run() -> int:
        torch.manual_seed(2)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=budget,
                min_new_tokens=0,
                num_return_sequences=N,
                eos_token_id=EOS,
                pad_token_id=PAD,
            )
        resp = out[:, PROMPT_LEN:]
        # a row's tokens run up to and including its first EOS (padding after it)
        is_eos = resp == EOS
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, resp.shape[1])
        return int(first.sum())

    return run


@measure(
    "long_generation",
    "tokens/s sampling 16/128/512-token responses: rltrain's loop (finished rows leave the "
    "batch) vs HF generate, same model",
)
def long_generation(quick: bool) -> Suite:
    import torch

    budgets = (16, 32) if quick else (16, 128, 512)
    # One thread for both loops: on a shared 2-core machine a second OpenMP thread waits on
    # the other processes and makes every step many times slower, hiding what is measured.
    previous = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    model = _model(PROMPT_LEN + max(budgets) + 8)
    cases, lengths = [], {}
    for budget in budgets:
        for label, make in (
            ("rltrain", _ours),
            ("rltrain, finished rows kept", _ours_keeping_rows),
            ("hf_generate", _hf),
        ):
            fn = make(model, budget)

            def call(fn=fn, budget=budget) -> int:
                _stop_bias(model, budget)
                return fn()

            tokens = call()  # fixed seeds: every call samples exactly these tokens
            name = f"{label} max_new_tokens={budget}"
            lengths[f"mean_response_tokens/{name}"] = tokens / (PROMPTS * N)
            # each budget's rows against generate's at the same budget: the same tokens
            base = f"hf_generate max_new_tokens={budget}"
            cases.append(Case(name, call, work=tokens, work_unit="tokens", baseline=base))
    return Suite(
        cases=tuple(cases),
        baseline=f"hf_generate max_new_tokens={budgets[-1]}",
        warmup=0 if quick else 1,  # --quick: each case already ran once above (its tokens)
        repeats=3,
        note=f"Qwen2 h{HIDDEN} x{LAYERS} layers, vocab {VOCAB}, random weights; {PROMPTS} prompts "
        f"x n={N} = {PROMPTS * N} rows of {PROMPT_LEN} prompt tokens; P(EOS) ~ 4/budget per "
        f"token; {THREADS} torch thread. Throughput: response tokens (EOS included) per s. "
        "Ratio: against hf_generate of the same max_new_tokens.",
        extras=lambda: lengths,
        teardown=lambda: torch.set_num_threads(previous),
    )
