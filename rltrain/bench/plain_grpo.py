"""Plain GRPO on the built-in arithmetic task: one process, no Ray, nothing from rltrain.

This is the honest baseline the distributed trainer is measured against, and the proof that the
learning itself works: from a randomly initialised tiny Llama, RL alone drives greedy accuracy on
``a+b=`` (operands 0..4) from ~0 to >= 0.9. Every setting below mirrors a shipped default
(``conf/model/tiny_llama.yaml``, ``conf/task/arithmetic.yaml``, ``conf/algorithm/grpo.yaml`` and
the trainer/rollout/optimizer defaults of ``rltrain/config/schema.py``); a unit test keeps them
equal. The data order and the character vocabulary are the same as ``rltrain.tasks``'.

    python rltrain/bench/plain_grpo.py --seed 1 --target-accuracy 0.9 --threads 2

It prints one JSON line: steps and seconds to reach the target, and the accuracy curve.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# ------------------------------------------------------------------ the shipped defaults, mirrored
DEFAULTS = {
    "seed": 1,  # run seed: the sampling random stream
    "init_seed": 0,  # model.init_seed
    "task_seed": 0,  # task.seed: the data order
    "max_operand": 4,  # task.max_operand
    "hidden_size": 64,  # model.*
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 4,
    "max_position_embeddings": 64,
    "lr": 3e-4,  # optimizer.*
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "grad_clip": 1.0,
    "n_samples_per_prompt": 16,  # rollout.*
    "temperature": 1.0,
    "max_new_tokens": 4,
    "train_batch_size": 8,  # trainer.*
    "total_steps": 500,
    "eval_every": 25,
    "clip_low": 0.2,  # algorithm.* (one on-policy step: the clip never binds, kept for fidelity)
    "clip_high": 0.2,
}
SPECIALS = ("<pad>", "<eos>", "<unk>")
CHARS = "0123456789+-*/=(). "  # the built-in tokenizer's default alphabet
VOCAB = {tok: i for i, tok in enumerate((*SPECIALS, *CHARS))}
PAD, EOS, UNK = 0, 1, 2


def build_model(init_seed: int) -> LlamaForCausalLM:
    """The tiny Llama, initialised from ``init_seed`` (same as ``rltrain.tasks.build_model``)."""
    d = DEFAULTS
    cfg = LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_layers"],
        num_attention_heads=d["num_heads"],
        num_key_value_heads=d["num_kv_heads"],
        max_position_embeddings=d["max_position_embeddings"],
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        return LlamaForCausalLM(cfg)


def all_prompts(max_operand: int) -> list[tuple[str, str]]:
    r = range(max_operand + 1)
    return [(f"{a}+{b}=", str(a + b)) for a in r for b in r]


def batch_at(data: list, step: int, batch_size: int, seed: int) -> list:
    """Epoch-wise seeded permutations, indexed by step (as ``Task.sample_batch``)."""
    out = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        order = list(range(len(data)))
        # Task.sample_batch's order (rltrain.config.seeds.epoch_order_seed), written out: this
        # loop imports nothing from rltrain.
        random.Random((seed * 1_000_003 + pos // len(data)) % 2**32).shuffle(order)
        out.append(data[order[pos % len(data)]])
    return out


def encode(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding: every row ends where generation starts
        ids[i, width - len(p) :] = torch.tensor([VOCAB.get(c, UNK) for c in p])
        mask[i, width - len(p) :] = 1
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(model, ids, mask, max_new: int, greedy: bool, gen: torch.Generator | None):
    """Responses ``[B, R]`` and their mask (1 up to and including EOS), with a KV cache."""
    model.eval()
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    toks, live = [], []
    attn, step_ids, pos, past = mask, ids, positions(mask), None
    for _ in range(max_new):
        out = model(
            input_ids=step_ids,
            attention_mask=attn,
            position_ids=pos,
            past_key_values=past,
            use_cache=True,
        )
        past, logits = out.past_key_values, out.logits[:, -1].float()
        if greedy:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / DEFAULTS["temperature"], -1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, PAD), tok)
        live.append(~done)
        toks.append(tok)
        done = done | (tok == EOS)
        if bool(done.all()):
            break
        attn = torch.cat([attn, (~done).long()[:, None]], 1)
        step_ids, pos = tok[:, None], pos[:, -1:] + 1
    return torch.stack(toks, 1), torch.stack(live, 1).float()


ITOS = {i: t for t, i in VOCAB.items()}


def reward(resp: list[int], mask: list[float], answer: str) -> float:
    toks = [t for t, m in zip(resp, mask, strict=True) if m]
    if toks and toks[-1] == EOS:
        toks = toks[:-1]
    return 1.0 if "".join(ITOS[t] for t in toks).strip() == answer else 0.0


def accuracy(model, data: list[tuple[str, str]]) -> float:
    ids, mask = encode([p for p, _ in data])
    resp, rmask = sample(model, ids, mask, DEFAULTS["max_new_tokens"], True, None)
    rows = zip(resp.tolist(), rmask.tolist(), data, strict=True)
    return sum(reward(r, m, a) for r, m, (_, a) in rows) / len(data)


def grpo_step(model, opt, batch, gen) -> float:
    """Sample n responses per prompt, score, normalise within groups, one clipped-PG step."""
    d, n = DEFAULTS, DEFAULTS["n_samples_per_prompt"]
    ids, mask = encode([p for p, _ in batch for _ in range(n)])
    resp, rmask = sample(model, ids, mask, d["max_new_tokens"], False, gen)
    answers = [a for _, a in batch for _ in range(n)]
    rows = zip(resp.tolist(), rmask.tolist(), answers, strict=True)
    rewards = torch.tensor([reward(r, m, a) for r, m, a in rows]).view(-1, n)
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    adv = adv.reshape(-1, 1)
    model.train()
    full, fmask = torch.cat([ids, resp], 1), torch.cat([mask, rmask.long()], 1)
    logits = model(input_ids=full, attention_mask=fmask, position_ids=positions(fmask)).logits
    logits = logits[:, ids.shape[1] - 1 : -1].float() / d["temperature"]
    logp = torch.log_softmax(logits, -1).gather(-1, resp[..., None]).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())  # on-policy: 1, but carries the gradient
    clipped = torch.clamp(ratio, 1 - d["clip_low"], 1 + d["clip_high"])
    per_tok = torch.maximum(-adv * ratio, -adv * clipped)
    loss = (per_tok * rmask).sum() / rmask.sum().clamp(min=1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), d["grad_clip"])
    opt.step()
    return rewards.mean().item()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="sampling seed")
    p.add_argument("--init-seed", type=int, default=None, help="model init (default: shipped)")
    p.add_argument("--steps", type=int, default=DEFAULTS["total_steps"])
    p.add_argument("--target-accuracy", type=float, default=None, help="stop once reached")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    p.add_argument("--eval-every", type=int, default=DEFAULTS["eval_every"])
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="for tuning only")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    init_seed = DEFAULTS["init_seed"] if args.init_seed is None else args.init_seed
    data = all_prompts(DEFAULTS["max_operand"])  # evaluation prompts = training prompts
    model = build_model(init_seed)
    d = DEFAULTS
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=args.lr,
        betas=d["betas"],
        eps=d["eps"],
        weight_decay=d["weight_decay"],
    )
    gen = torch.Generator().manual_seed(args.seed)
    curve = [[0, 0.0, accuracy(model, data)]]
    # the clock starts at the first step, as rltrain's does (it evaluates no step 0)
    start = time.perf_counter()
    reached_at, step, mean_reward = None, 0, 0.0
    for step in range(1, args.steps + 1):
        batch = batch_at(data, step - 1, d["train_batch_size"], d["task_seed"])
        mean_reward = grpo_step(model, opt, batch, gen)
        if step % args.eval_every == 0 or step == args.steps:
            acc = accuracy(model, data)
            # read after the evaluation: the span ends where rltrain's does, with that evaluation
            curve.append([step, round(time.perf_counter() - start, 2), acc])
            target = args.target_accuracy
            if target is not None and curve[-1][2] >= target:
                reached_at = curve[-1]
                break
    result = {
        "seed": args.seed,
        "init_seed": init_seed,
        "threads": args.threads,
        "lr": args.lr,
        "steps": step,
        "seconds": round(time.perf_counter() - start, 2),
        "target_accuracy": args.target_accuracy,
        "time_to_target_s": reached_at[1] if reached_at else None,
        "steps_to_target": reached_at[0] if reached_at else None,
        "initial_accuracy": curve[0][2],
        "final_accuracy": curve[-1][2],
        "last_mean_reward": mean_reward,
        "curve": curve,
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
