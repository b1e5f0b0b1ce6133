"""GPU measurements: state offload/reload, DeepSpeed offload_states, CUDA-IPC sync.

Run on a CUDA machine with torch (and the carried wheels, for DeepSpeed)::

    python tools/gpu/gpu_bench.py --out bench.json [--sections mover,ds,ipc,zero3]

The model is a ~0.5B-parameter Qwen2 built from a config with random weights (hidden 896,
24 layers, 14 heads, 2 KV heads, vocab 151936: Qwen2.5-0.5B's shape). Every figure is the
median of several timed repetitions after a warm-up, with device synchronisation around the
region; each is printed next to a same-run baseline (a plain copy of the same bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.multiprocessing as mp

GB = 1e9
REPEATS = 5


def qwen2_half_b(dtype: torch.dtype) -> torch.nn.Module:
    """A Qwen2.5-0.5B-shaped causal LM with random weights on the current GPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    return model


def timed(fn: Callable[[], object], repeats: int = REPEATS) -> tuple[float, list[float]]:
    """Median seconds of ``fn`` (synchronised), after one untimed warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def free_bytes() -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


# --------------------------------------------------------------------------------- baselines
def copy_baselines(nbytes: int) -> dict[str, float]:
    """GB/s of plain copies of ``nbytes``: D2H/H2D pinned, D2H pageable (``.to('cpu')``)."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h, _ = timed(lambda: pinned.copy_(dev, non_blocking=True))
    h2d, _ = timed(lambda: dev.copy_(pinned, non_blocking=True))
    pageable, _ = timed(lambda: dev.to("cpu"), repeats=3)
    todev, _ = timed(lambda: pinned.to("cuda"), repeats=3)
    return {
        "d2h_pinned_GBps": nbytes / d2h / GB,
        "h2d_pinned_GBps": nbytes / h2d / GB,
        "d2h_pageable_to_cpu_GBps": nbytes / pageable / GB,
        "h2d_pinned_to_cuda_alloc_GBps": nbytes / todev / GB,
    }


# ------------------------------------------------------------------------------ state mover
def bench_mover() -> dict[str, object]:
    from rltrain.backends.offload import StateMover, device_storages

    model = qwen2_half_b(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, 151936, (2, 128), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    held = device_storages(model, opt)
    total = sum(held.values())
    mover = StateMover(model, opt)

    # First offload pins the host buffers (a one-time cost); later ones reuse them.
    free0 = free_bytes()
    t0 = time.perf_counter()
    mover.offload()
    first_offload = time.perf_counter() - t0
    freed = free_bytes() - free0
    t0 = time.perf_counter()
    mover.reload()
    first_reload = time.perf_counter() - t0

    off_times, on_times = [], []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mover.offload()
        off_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mover.reload()
        on_times.append(time.perf_counter() - t0)
    off, on = statistics.median(off_times), statistics.median(on_times)
    base = copy_baselines(total)
    out = {
        "model_params": params,
        "bytes_by_kind": held,
        "total_bytes": total,
        "freed_bytes_seen_by_driver": freed,
        "first_offload_s": first_offload,
        "first_reload_s": first_reload,
        "offload_s": off,
        "reload_s": on,
        "offload_GBps": total / off / GB,
        "reload_GBps": total / on / GB,
        "offload_times": off_times,
        "reload_times": on_times,
        **base,
    }
    del mover, opt, model
    torch.cuda.empty_cache()
    return out


# -------------------------------------------------------------------------------- deepspeed
def bench_deepspeed(stage: int, optimizer: str) -> dict[str, object]:
    from rltrain.backends.deepspeed_engine import DeepSpeedActor, DeepSpeedSettings
    from rltrain.config.offload import OffloadPolicy

    policy = OffloadPolicy("after_stage", frozenset({"weights", "grads", "optimizer"}))
    settings = DeepSpeedSettings(
        zero_stage=stage,
        dtype="bfloat16",
        optimizer=optimizer,
        lr=1e-5,
        micro_batch_size=2,
        policy=policy,
    )
    model = qwen2_half_b(torch.float32).cpu()
    torch.cuda.empty_cache()
    free_start = free_bytes()
    t0 = time.perf_counter()
    actor = DeepSpeedActor(model, settings)
    init_s = time.perf_counter() - t0
    ids = torch.randint(0, 151936, (2, 128), device=actor.device)

    def loss_fn(engine, mb):
        return engine(input_ids=mb, labels=mb).loss

    t0 = time.perf_counter()
    actor.train_step([ids], loss_fn)
    torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    resident = free_start - free_bytes()
    off_times, on_times, freed = [], [], []
    for _ in range(REPEATS + 1):
        free0 = free_bytes()
        t0 = time.perf_counter()
        actor.offload_states()
        off_times.append(time.perf_counter() - t0)
        freed.append(free_bytes() - free0)
        t0 = time.perf_counter()
        actor.reload_states()
        on_times.append(time.perf_counter() - t0)
    loss = actor.train_step([ids], loss_fn)
    out = {
        "zero_stage": stage,
        "optimizer": optimizer,
        "init_s": init_s,
        "first_step_s": step_s,
        "resident_bytes_after_step": resident,
        "freed_bytes": statistics.median(freed[1:]),
        "first_offload_s": off_times[0],
        "first_reload_s": on_times[0],
        "offload_s": statistics.median(off_times[1:]),
        "reload_s": statistics.median(on_times[1:]),
        "offload_GBps_of_freed": statistics.median(freed[1:])
        / statistics.median(off_times[1:])
        / GB,
        "reload_GBps_of_freed": statistics.median(freed[1:]) / statistics.median(on_times[1:]) / GB,
        "loss_after_reload": loss,
    }
    del actor
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------- ipc sync
def _ipc_receiver(inbox, outbox) -> None:
    from rltrain.backends.weight_sync.ipc import receive_ipc

    model = qwen2_half_b(torch.bfloat16)
    params = dict(model.named_parameters())
    outbox.put("ready")
    while True:
        msg = inbox.get(timeout=300)
        if msg is None:
            return
        written = receive_ipc(msg, params)
        sums = {n: int(p.view(torch.int16).to(torch.int64).sum()) for n, p in params.items()}
        outbox.put((written, sums) if msg.version == 0 else written)


def bench_ipc() -> dict[str, object]:
    from rltrain.backends.weight_sync.ipc import IpcSender

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_ipc_receiver, args=(inbox, outbox), daemon=True)
    proc.start()
    model = qwen2_half_b(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    named = list(model.named_parameters())
    nbytes = sum(p.numel() * p.element_size() for _, p in named)
    assert outbox.get(timeout=300) == "ready"
    out: dict[str, object] = {"bytes": nbytes, "params": sum(p.numel() for _, p in named)}
    for label, release in (("fresh_buffers", True), ("reused_buffers", False)):
        sender = IpcSender(rank=0)
        times = []
        for version in range(REPEATS + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            payload = sender.publish(named, version=version if label == "fresh_buffers" else 1)
            inbox.put(payload)
            reply = outbox.get(timeout=300)
            times.append(time.perf_counter() - t0)
            if release:
                sender.release()
            if isinstance(reply, tuple):
                written, sums = reply
                ref = {n: int(p.view(torch.int16).to(torch.int64).sum()) for n, p in named}
                out["bit_exact_checksums"] = sums == ref
                out["tensors_written"] = written
        sender.release()
        out[f"{label}_first_s"] = times[0]
        out[f"{label}_s"] = statistics.median(times[1:])
        out[f"{label}_times"] = times
        out[f"{label}_GBps"] = nbytes / statistics.median(times[1:]) / GB
    inbox.put(None)
    proc.join(timeout=60)
    # Baseline: one device-to-device copy of the same bytes (what IPC sync does at the least).
    flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(flat)
    d2d, _ = timed(lambda: dst.copy_(flat))
    out["d2d_copy_same_bytes_s"] = d2d
    return out


def profile_deepspeed(stage: int = 2) -> dict[str, object]:
    """Where a DeepSpeed offload spends its time: per kind, and cProfile's top entries."""
    import cProfile
    import io
    import pstats

    from rltrain.backends.deepspeed_engine import DeepSpeedActor, DeepSpeedSettings
    from rltrain.config.offload import OffloadPolicy

    policy = OffloadPolicy("after_stage", frozenset({"weights", "grads", "optimizer"}))
    settings = DeepSpeedSettings(zero_stage=stage, dtype="bfloat16", lr=1e-5, policy=policy)
    actor = DeepSpeedActor(qwen2_half_b(torch.float32).cpu(), settings)
    ids = torch.randint(0, 151936, (2, 128), device=actor.device)
    actor.train_step([ids], lambda engine, mb: engine(input_ids=mb, labels=mb).loss)
    out: dict[str, object] = {}
    for kinds in (["weights"], ["grads"], ["optimizer"], ["weights", "grads", "optimizer"]):
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            actor.offload_states(kinds)
            times.append(time.perf_counter() - t0)
            actor.reload_states()
        out["offload_s_" + "+".join(kinds)] = statistics.median(times)
    prof = cProfile.Profile()
    prof.enable()
    actor.offload_states()
    prof.disable()
    actor.reload_states()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    print(text.getvalue()[-6000:])
    del actor
    torch.cuda.empty_cache()
    return out


SECTIONS = {
    "dsprof": profile_deepspeed,
    "mover": bench_mover,
    "ipc": bench_ipc,
    "ds2": lambda: bench_deepspeed(2, "adamw"),
    "ds1": lambda: bench_deepspeed(1, "adamw"),
    "zero3": lambda: bench_deepspeed(3, "deepspeed_adamw"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_bench.json")
    ap.add_argument("--sections", default="mover,ipc,ds2,zero3")
    ap.add_argument("--deadline-s", type=float, default=500.0, help="skip sections after this")
    args = ap.parse_args()
    start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    results: dict[str, object] = {
        "device": props.name,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "total_memory": props.total_memory,
    }
    for name in args.sections.split(","):
        if time.perf_counter() - start > args.deadline_s:
            results[name] = {"skipped": "deadline"}
            continue
        t0 = time.perf_counter()
        try:
            results[name] = SECTIONS[name]()
        except Exception as exc:  # a failed section must not hide the others' numbers
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(
            f"[{name}] {time.perf_counter() - t0:.1f}s: {json.dumps(results[name])[:1500]}",
            flush=True,
        )
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    print(json.dumps(results, indent=1, default=str)[:6000])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
