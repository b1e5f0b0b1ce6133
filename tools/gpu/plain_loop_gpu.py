"""The plain baseline on one GPU: HF ``generate`` + the same GRPO update, one process, no Ray.

The GPU twin of ``rltrain/bench/plain_grpo.py`` (whose prompts, data order, vocabulary and
reward it reuses), sized like the runs of tools/gpu/run.sh: the model of
``conf/model/qwen2_0_5b.yaml`` built from config on the GPU with random weights, 8 prompts x 16
samples a step, responses of up to 256 new tokens, torch AdamW with the shipped
``optimizer.*`` defaults, one clipped policy-gradient step a step (token mean) accumulated
over micro-batches of 64 rows as ``actor.micro_batch_size`` does.

    python3 tools/gpu/plain_loop_gpu.py --out plain.json [--steps 20] [--max-new-tokens 256]

Each step is timed by stage with the device synchronised around it; the JSON holds every
step, the medians over the steps after the warm-up ones, tokens/s, and the GPU memory the
driver saw at each stage's end and the allocator's peak per stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from rltrain.bench.plain_grpo import (  # noqa: E402  (the CPU loop's data, reused as is)
    DEFAULTS,
    EOS,
    PAD,
    VOCAB,
    all_prompts,
    batch_at,
    encode,
    positions,
)

ITOS = {i: t for t, i in VOCAB.items()}


def build_model(model_yaml: Path, device: torch.device) -> torch.nn.Module:
    """The model of ``model_yaml`` (rltrain's ``model.*`` fields) with random weights.

    The vocabulary is the built-in tokenizer's unless the file names a larger
    ``vocab_size`` (ids the tokenizer never produces pad the embedding, as in rltrain).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = yaml.safe_load(model_yaml.read_text())
    if m.get("family", "qwen2") != "qwen2":
        raise SystemExit(f"{model_yaml}: family {m['family']!r}; this loop builds qwen2 models")
    cfg = Qwen2Config(
        vocab_size=max(len(VOCAB), int(m.get("vocab_size") or 0)),
        hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"],
        num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"],
        num_key_value_heads=m["num_kv_heads"],
        max_position_embeddings=m["max_position_embeddings"],
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
        tie_word_embeddings=bool(m.get("tie_word_embeddings", False)),
    )
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(m.get("init_seed", 0)))
        with device:
            model = Qwen2ForCausalLM(cfg)
    # model.dtype null follows the checkpoint; a built-in model has none, so bf16 as on GPU.
    return model.to(dtype[m.get("dtype") or "bfloat16"])


def response_mask(resp: torch.Tensor) -> torch.Tensor:
    """1 up to and including each row's first EOS, 0 after it (HF pads finished rows)."""
    is_eos = (resp == EOS).int()
    before = is_eos.cumsum(1) - is_eos  # EOS tokens strictly before this position
    return (before == 0).float()


def rewards(resp: torch.Tensor, mask: torch.Tensor, answers: list[str]) -> torch.Tensor:
    """Exact-match reward of the decoded responses (ids outside the alphabet decode to '')."""
    out = []
    for row, m, answer in zip(resp.tolist(), mask.tolist(), answers, strict=True):
        toks = [t for t, keep in zip(row, m, strict=True) if keep and t != EOS]
        out.append(1.0 if "".join(ITOS.get(t, "") for t in toks).strip() == answer else 0.0)
    return torch.tensor(out)


class Stages:
    """Synchronised wall-clock seconds and GPU memory per stage of one step (time only on CPU,
    where ``--device cpu`` checks the loop itself with a small model)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.times: dict[str, float] = {}
        self.memory: dict[str, dict[str, int]] = {}

    def run(self, name: str, fn):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        if self.cuda:
            torch.cuda.synchronize()
        self.times[name] = time.perf_counter() - t0
        if self.cuda:
            free, total = torch.cuda.mem_get_info()
            self.memory[name] = {
                "allocator_peak_bytes": torch.cuda.max_memory_allocated(),
                "driver_used_bytes_at_end": total - free,
            }
        return out


def step(model, opt, batch, args, gen: torch.Generator) -> dict:
    """One GRPO step; returns its times, memory and token counts."""
    n = args.samples
    device = next(model.parameters()).device
    st = Stages(device)
    ids, mask = encode([p for p, _ in batch for _ in range(n)])
    ids, mask = ids.to(device), mask.to(device)

    def generate():
        model.eval()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=DEFAULTS["temperature"],
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=PAD,
                eos_token_id=EOS,
            )
        return out[:, ids.shape[1] :]

    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    resp = st.run("generate", generate)
    rmask = response_mask(resp)
    answers = [a for _, a in batch for _ in range(n)]

    def score():
        r = rewards(resp.cpu(), rmask.cpu(), answers).view(-1, n)
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
        return r, adv.reshape(-1, 1).to(device)

    r, adv = st.run("reward", score)

    def train():
        model.train()
        full = torch.cat([ids, resp], 1)
        fmask = torch.cat([mask, rmask.long()], 1)
        total = rmask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        for lo in range(0, full.shape[0], args.micro_batch):
            sl = slice(lo, lo + args.micro_batch)
            logits = model(
                input_ids=full[sl], attention_mask=fmask[sl], position_ids=positions(fmask[sl])
            ).logits
            logits = logits[:, ids.shape[1] - 1 : -1].float() / DEFAULTS["temperature"]
            logp = torch.log_softmax(logits, -1).gather(-1, resp[sl, :, None]).squeeze(-1)
            ratio = torch.exp(logp - logp.detach())  # on-policy: 1, but carries the gradient
            clipped = torch.clamp(ratio, 1 - DEFAULTS["clip_low"], 1 + DEFAULTS["clip_high"])
            per_tok = torch.maximum(-adv[sl] * ratio, -adv[sl] * clipped)
            ((per_tok * rmask[sl]).sum() / total).backward()  # token mean over the whole batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), DEFAULTS["grad_clip"])
        opt.step()

    st.run("train", train)
    tokens = int(rmask.sum())
    step_s = sum(st.times.values())
    return {
        "times_s": st.times,
        "step_s": step_s,
        "response_tokens": tokens,
        "tokens_per_s": tokens / step_s,
        "generate_tokens_per_s": tokens / st.times["generate"],
        "reward_mean": float(r.mean()),
        "memory": st.memory,
    }


def summarise(steps: list[dict], warmup: int) -> dict:
    """Medians over the steps after ``warmup`` (all steps when there are no others)."""
    kept = steps[warmup:] or steps
    med = statistics.median
    return {
        "steps_measured": len(kept),
        "step_s": med(s["step_s"] for s in kept),
        "times_s": {k: med(s["times_s"][k] for s in kept) for k in kept[0]["times_s"]},
        "tokens_per_s": med(s["tokens_per_s"] for s in kept),
        "generate_tokens_per_s": med(s["generate_tokens_per_s"] for s in kept),
        "response_tokens_per_step": med(s["response_tokens"] for s in kept),
        "allocator_peak_bytes": max(
            (m["allocator_peak_bytes"] for s in steps for m in s["memory"].values()), default=None
        ),
        "driver_used_bytes_max": max(
            (m["driver_used_bytes_at_end"] for s in steps for m in s["memory"].values()),
            default=None,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-yaml", type=Path, default=ROOT / "conf/model/qwen2_0_5b.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=DEFAULTS["train_batch_size"])
    ap.add_argument("--samples", type=int, default=DEFAULTS["n_samples_per_prompt"])
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    ap.add_argument("--device", default="cuda", help="cpu: check the loop with a small model")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    model = build_model(args.model_yaml, device)
    build_s = time.perf_counter() - t0
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=DEFAULTS["lr"],
        betas=DEFAULTS["betas"],
        eps=DEFAULTS["eps"],
        weight_decay=DEFAULTS["weight_decay"],
    )
    data = all_prompts(DEFAULTS["max_operand"])
    gen = torch.Generator().manual_seed(args.seed)
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "params": sum(p.numel() for p in model.parameters()),
        "model_build_s": build_s,
        "settings": vars(args) | {"model_yaml": str(args.model_yaml)},
        "steps": [],
    }
    for s in range(args.steps):
        batch = batch_at(data, s, args.batch, DEFAULTS["task_seed"])
        result["steps"].append(step(model, opt, batch, args, gen))
        last = result["steps"][-1]
        print(
            f"step {s}: {last['step_s']:.2f} s, {last['tokens_per_s']:.0f} tok/s, "
            f"{json.dumps({k: round(v, 3) for k, v in last['times_s'].items()})}",
            flush=True,
        )
        result["summary"] = summarise(result["steps"], args.warmup)
        with open(args.out, "w") as f:  # written every step: a timeout keeps what ran
            json.dump(result, f, indent=1)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
