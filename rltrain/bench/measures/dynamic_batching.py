"""``dynamic_batching``: one actor update on a length-skewed batch, fixed micro-batches of
``actor.micro_batch_size`` rows against micro-batches formed by a token budget
(``actor.max_tokens_per_micro_batch``).

A small Qwen2 (hidden 256, 4 layers, vocabulary 512, random weights, float32) takes one
optimizer step (:func:`rltrain.algorithms.update.ppo_update`, one epoch, one minibatch, GRPO
advantages, token-mean loss) on 64 rows: prompts of 16-32 tokens (left-padded), 56 responses of
4-32 tokens and 8 at the full budget of 256 (right-padded), the long rows scattered through the
batch as sampling leaves them. Every case sees the same rows and the same shuffle and computes the
same gradient (the extras give the largest difference of any gradient element from the
baseline's, and each case's forward passes and padded tokens). Micro-batches are cut to their
own padded width in the baseline as under a budget, so what the budget adds is the grouping: rows
of similar length share a micro-batch, and a micro-batch holds as many rows as fit.

Cases: 8-row micro-batches (the baseline; its largest forward holds 8 full rows), the same with
every micro-batch padded to the whole batch's width (how the engine ran before micro-batches were
cut to their own), a budget of 8 full rows (the same peak memory as the baseline) and a budget of
2 full rows (a quarter of it). The optimizer is SGD with learning rate 0, so every call starts
from the same weights and does the same work.
"""

from __future__ import annotations

from typing import Any

from rltrain.bench.harness import Case, Suite, measure

VOCAB, HIDDEN, LAYERS, HEADS = 512, 256, 4, 4
THREADS = 1


def _shape(quick: bool) -> dict[str, int]:
    if quick:
        return {"rows": 16, "long": 2, "prompt": 16, "new": 64, "micro": 4, "hidden": 64}
    return {"rows": 64, "long": 8, "prompt": 32, "new": 256, "micro": 8, "hidden": HIDDEN}


def _model(shape: dict[str, int]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=shape["hidden"],
        intermediate_size=2 * shape["hidden"],
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=shape["prompt"] + shape["new"] + 8,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config)


def _batch(shape: dict[str, int]) -> Any:
    """Rows with most responses short and ``long`` of them at the full budget, interleaved."""
    import torch

    from rltrain.algorithms.batch import RolloutBatch

    g = torch.Generator().manual_seed(1)
    rows, p, r = shape["rows"], shape["prompt"], shape["new"]
    resp_len = torch.randint(4, 33, (rows,), generator=g)
    resp_len[:: rows // shape["long"]] = r  # every (rows/long)-th row runs to the budget
    prompt_len = torch.randint(p // 2, p + 1, (rows,), generator=g)
    prompt_mask = (torch.arange(p)[None, :] >= (p - prompt_len)[:, None]).long()
    response_mask = (torch.arange(r)[None, :] < resp_len[:, None]).float()
    return RolloutBatch(
        prompt_ids=torch.randint(2, VOCAB, (rows, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(2, VOCAB, (rows, r), generator=g) * response_mask.long(),
        response_mask=response_mask,
        group_size=8,
        rewards=torch.randint(0, 2, (rows,), generator=g).float(),
    )


def _update(
    model: Any, batch: Any, settings: Any, micro: int, budget: int | None, trim: bool = True
):
    import torch

    from rltrain.algorithms import update

    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def run() -> dict[str, float]:
        # trim=False: every micro-batch padded to the whole batch's width, as before micro-
        # batches were cut to their own (to tell that gain from the grouping's)
        default = update.trim_padding
        update.trim_padding = default if trim else lambda b: b
        try:
            gen = torch.Generator().manual_seed(3)
            return update.ppo_update(
                model, opt, batch, settings, generator=gen, micro_batch=micro, max_tokens=budget
            )
        finally:
            update.trim_padding = default

    return run


@measure(
    "dynamic_batching",
    "one actor update on a length-skewed batch: fixed-row micro-batches vs "
    "actor.max_tokens_per_micro_batch budgets, same rows, same gradient",
)
def dynamic_batching(quick: bool) -> Suite:
    import torch

    from rltrain.algorithms.logprobs import compute_logprobs
    from rltrain.algorithms.update import UpdateSettings, add_advantages

    shape = _shape(quick)
    previous = torch.get_num_threads()
    torch.set_num_threads(THREADS)  # a shared 2-core machine: see long_generation
    model = _model(shape)
    settings = UpdateSettings(max_new_tokens=shape["new"], grad_clip=0.0)
    batch = _batch(shape)
    with torch.no_grad():
        old = compute_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    batch = add_advantages(batch.replace(old_logprobs=old), settings)
    full_row = shape["prompt"] + shape["new"]
    micro = shape["micro"]
    variants = (
        (f"fixed micro_batch_size={micro}", micro, None, True),
        (f"fixed micro_batch_size={micro}, untrimmed", micro, None, False),
        (
            f"max_tokens_per_micro_batch={micro * full_row} ({micro} full rows)",
            0,
            micro * full_row,
            True,
        ),
        (f"max_tokens_per_micro_batch={2 * full_row} (2 full rows)", 0, 2 * full_row, True),
    )
    seen: list[tuple[int, int]] = []
    hook = model.register_forward_hook(
        lambda m, args, kw, out: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    cases, extras, grads = [], {}, {}
    for name, rows, budget, trim in variants:
        fn = _update(model, batch, settings, rows, budget, trim)
        seen.clear()
        fn()  # once outside the timing: the forwards it runs and the gradient it leaves
        grads[name] = [p.grad.clone() for p in model.parameters()]
        extras[f"micro_batches/{name}"] = len(seen)
        extras[f"padded_tokens/{name}"] = sum(b * w for b, w in seen)
        extras[f"largest_forward_tokens/{name}"] = max(b * w for b, w in seen)
        cases.append(Case(name, fn))
    hook.remove()
    base = grads[variants[0][0]]
    for name, g in grads.items():
        diff = max(float((a - b).abs().max()) for a, b in zip(g, base, strict=True))
        extras[f"max_grad_diff_vs_baseline/{name}"] = diff
    extras["grad_max_abs/baseline"] = max(float(a.abs().max()) for a in base)
    return Suite(
        cases=tuple(cases),
        baseline=variants[0][0],
        warmup=0 if quick else 1,  # --quick: each case already ran once above (its gradient)
        repeats=3,
        note=f"Qwen2 h{shape['hidden']} x{LAYERS} layers, vocab {VOCAB}, random weights, "
        f"float32; {shape['rows']} rows: prompts {shape['prompt'] // 2}-{shape['prompt']} "
        f"tokens, {shape['rows'] - shape['long']} responses of 4-32 tokens and {shape['long']} "
        f"of {shape['new']} (a full row: {full_row} tokens); one optimizer step (SGD, lr 0: "
        f"same work every call), token_mean; {THREADS} torch thread.",
        extras=lambda: extras,
        teardown=lambda: torch.set_num_threads(previous),
    )
