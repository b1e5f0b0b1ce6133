"""The standalone vLLM baseline: one engine, the runs' prompts, and its sleep/wake speed.

What ``rollout.backend=vllm`` is measured against (tools/gpu/run.sh): a plain ``vllm.LLM`` on
the model of ``conf/model/qwen2_0_5b.yaml`` (config and tokenizer written by rltrain's own
builders, ``load_format="dummy"``: random weights, nothing to download), generating the
prompts the runs generate (8 arithmetic prompts a step in the task's order, 16 samples each,
temperature 1, up to 256 new tokens) with the rollout's default share of the device
(``rollout.gpu_memory_utilization``). Then sleep and wake cycles, the driver's used memory
(NVML) read around each: level 1 (weights to host, KV cache dropped) woken all at once and tag
by tag (weights, then KV cache: the rollout's order), and level 2 (everything dropped).

    python3 tools/gpu/vllm_engine.py --out vllm_engine.json [--steps 20] [--cycles 3]

Needs a GPU and vLLM (the bundle of tools/gpu/build.sh); set VLLM_USE_FLASHINFER_SAMPLER=0
there (flashinfer is not in the bundle).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GB = 1e9


def write_model_dir(model_yaml: Path, out: Path) -> dict:
    """Write ``config.json`` and the tokenizer of ``model_yaml`` as rltrain builds them.

    Returns:
        A few facts about the model (vocabulary, parameters, weight bytes in bf16).
    """
    from omegaconf import OmegaConf

    from rltrain.config.schema import ModelConfig
    from rltrain.tasks.model import tiny_model_config
    from rltrain.tasks.tokenizer import build_tokenizer

    m = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(model_yaml))
    tok = build_tokenizer(m)
    cfg = tiny_model_config(m, tok)
    cfg.architectures = [type(cfg).__name__.replace("Config", "ForCausalLM")]
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    return {"vocab_size": cfg.vocab_size, "params": params, "weight_bytes_bf16": 2 * params}


def prompts_of_step(step: int, batch: int) -> list[list[int]]:
    """The token ids of step ``step``'s prompts (the arithmetic task's order and alphabet)."""
    from rltrain.bench.plain_grpo import DEFAULTS, VOCAB, all_prompts, batch_at

    data = all_prompts(DEFAULTS["max_operand"])
    return [[VOCAB[c] for c in p] for p, _ in batch_at(data, step, batch, DEFAULTS["task_seed"])]


def median_after(values: list[float], warmup: int) -> float | None:
    kept = values[warmup:] or values
    return statistics.median(kept) if kept else None


def baseline_engine_kwargs(
    model_dir: str,
    *,
    max_model_len: int,
    gpu_memory_utilization: float,
    seed: int,
    enforce_eager: bool,
) -> dict:
    """The ``vllm.LLM(...)`` arguments of the baseline: rltrain's rollout's own
    (:func:`rltrain.backends.vllm_rollout.engine_kwargs`, so the two differ only where said),
    minus its worker extension (the baseline loads no weights), with random weights.

    Args:
        model_dir: the directory :func:`write_model_dir` wrote.
        max_model_len: the engine's length budget.
        gpu_memory_utilization: the device share (the rollout's default, 0.3).
        seed: the engine's seed.
        enforce_eager: no CUDA graphs / torch.compile (``VLLM_EAGER=1`` of tools/gpu/run.sh).

    Returns:
        Keyword arguments of vLLM 0.26.0's ``LLM``.
    """
    from rltrain.backends.vllm_rollout import VllmSettings, engine_kwargs

    settings = VllmSettings(
        model_path=model_dir,
        gpu_memory_utilization=gpu_memory_utilization,
        dtype="bfloat16",
        seed=seed,
        max_model_len=max_model_len,
        load_format="dummy",
    )
    kwargs = engine_kwargs(settings)
    del kwargs["worker_extension_cls"]
    return kwargs | {"enforce_eager": enforce_eager}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-yaml", type=Path, default=ROOT / "conf/model/qwen2_0_5b.yaml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="0: longest prompt + new tokens (the runs "
        "pass task.max_prompt_length + rollout.max_new_tokens, as the rollout sizes it)",
    )
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--cycles", type=int, default=3, help="sleep/wake cycles per kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--seeded-steps",
        type=int,
        default=4,
        help="steps of a second pass asking as the rollout asks (rltrain's sampling_kwargs: "
        "a seed per call); 0: none",
    )
    args = ap.parse_args(argv)

    from memwatch import reader
    from vllm import LLM, SamplingParams

    from rltrain.backends.vllm_rollout import keep_engine_in_process
    from rltrain.bench.plain_grpo import EOS

    used = reader(0)
    result: dict = {"date": time.strftime("%Y-%m-%d"), "settings": vars(args) | {}}
    result["settings"]["model_yaml"] = str(args.model_yaml)
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    with tempfile.TemporaryDirectory() as model_dir:
        result["model"] = write_model_dir(args.model_yaml, Path(model_dir))
        longest = max(len(p) for s in range(args.steps) for p in prompts_of_step(s, args.batch))
        max_len = args.max_model_len or longest + args.max_new_tokens
        used_before = used()
        t0 = time.perf_counter()
        keep_engine_in_process()  # as the rollout does: the engine core in this process
        llm = LLM(
            **baseline_engine_kwargs(
                model_dir,
                max_model_len=max_len,
                gpu_memory_utilization=args.gpu_memory_utilization,
                seed=args.seed,
                enforce_eager=args.enforce_eager,
            )
        )
        result["engine_init_s"] = time.perf_counter() - t0
        result["used_bytes_before_engine"] = used_before
        result["used_bytes_engine_awake"] = used()
        # What a GRPO rollout asks for: n samples, the sampled tokens' log-probs, stop at EOS
        # by id. No per-request seed (the engine's seed decides): what a plain user would run.
        params = SamplingParams(
            n=args.samples,
            temperature=1.0,
            top_p=1.0,
            max_tokens=args.max_new_tokens,
            logprobs=0,
            stop_token_ids=[EOS],
            detokenize=False,
        )
        steps = []
        for s in range(args.steps):
            prompts = [{"prompt_token_ids": ids} for ids in prompts_of_step(s, args.batch)]
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            secs = time.perf_counter() - t0
            tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
            steps.append({"generate_s": secs, "tokens": tokens, "tokens_per_s": tokens / secs})
            print(f"step {s}: {secs:.3f} s, {tokens} tokens, {tokens / secs:.0f} tok/s", flush=True)
        result["steps"] = steps
        result["generate_s"] = median_after([x["generate_s"] for x in steps], args.warmup)
        result["tokens_per_s"] = median_after([x["tokens_per_s"] for x in steps], args.warmup)
        result["tokens_per_step"] = median_after([x["tokens"] for x in steps], args.warmup)
        save()
        if args.seeded_steps:
            result["seeded"] = seeded_pass(llm, args)
            save()

        cycles: dict[str, list[dict]] = {"level1_all": [], "level1_tags": [], "level2_all": []}
        for kind, level, tag_wise in (
            ("level1_all", 1, False),
            ("level1_tags", 1, True),
            ("level2_all", 2, False),
        ):
            for _ in range(args.cycles):
                awake = used()
                t0 = time.perf_counter()
                llm.sleep(level=level)
                sleep_s = time.perf_counter() - t0
                asleep = used()
                row = {"sleep_s": sleep_s, "freed_bytes": awake - asleep}
                if tag_wise:
                    t0 = time.perf_counter()
                    llm.wake_up(tags=["weights"])
                    row["wake_weights_s"] = time.perf_counter() - t0
                    row["weights_bytes_back"] = used() - asleep
                    t0 = time.perf_counter()
                    llm.wake_up(tags=["kv_cache"])
                    row["wake_kv_cache_s"] = time.perf_counter() - t0
                    row["wake_s"] = row["wake_weights_s"] + row["wake_kv_cache_s"]
                else:
                    t0 = time.perf_counter()
                    llm.wake_up()
                    row["wake_s"] = time.perf_counter() - t0
                row["restored_bytes"] = used() - asleep
                # the engine must still generate after waking (level 2's weights are garbage)
                t0 = time.perf_counter()
                one = [{"prompt_token_ids": prompts_of_step(0, 1)[0]}]
                llm.generate(one, params, use_tqdm=False)
                row["first_generate_after_wake_s"] = time.perf_counter() - t0
                cycles[kind].append(row)
                print(f"{kind}: {json.dumps({k: round(v, 4) for k, v in row.items()})}", flush=True)
            save()
        result["sleep_wake"] = cycles
        weights = result["model"]["weight_bytes_bf16"]
        med = statistics.median
        summary = {}
        for kind, rows in cycles.items():
            if not rows:
                continue
            sleep_s, wake_s = med(r["sleep_s"] for r in rows), med(r["wake_s"] for r in rows)
            summary[kind] = {
                "sleep_s": sleep_s,
                "wake_s": wake_s,
                "freed_bytes": med(r["freed_bytes"] for r in rows),
                # level 1 copies the weights each way; the KV cache is dropped, not copied
                "weights_GBps_sleep": weights / sleep_s / GB if level_copies(kind) else None,
                "weights_GBps_wake": weights / wake_s / GB if level_copies(kind) else None,
                "freed_GBps_sleep_plus_wake": med(r["freed_bytes"] for r in rows)
                / (sleep_s + wake_s)
                / GB,
            }
        result["sleep_wake_summary"] = summary
        save()
    print(json.dumps({k: result[k] for k in ("tokens_per_s", "sleep_wake_summary")}, indent=1))
    return 0


def seeded_pass(llm: object, args: argparse.Namespace) -> dict:
    """The same prompts asked for as ``rollout.backend=vllm`` asks: rltrain's own
    :func:`~rltrain.backends.vllm_rollout.sampling_kwargs` with a sampling seed per call, which
    gives vLLM a generator per request. Against the unseeded pass above this isolates what the
    seeds cost from what the rollout adds around the engine (Ray, the wake, reading outputs).

    Returns:
        Per-step seconds and tokens, and the medians after the first step.
    """
    from vllm import SamplingParams

    from rltrain.backends.vllm_rollout import sampling_kwargs, token_prompts
    from rltrain.bench.plain_grpo import EOS
    from rltrain.config.seeds import sampling_seed

    steps = []
    for s in range(args.seeded_steps):
        params = SamplingParams(
            **sampling_kwargs(
                n=args.samples,
                temperature=1.0,
                top_p=1.0,
                max_new_tokens=args.max_new_tokens,
                seed=sampling_seed(args.seed, s, 0),
                logprobs=True,
                stop_token_ids=[EOS],
            )
        )
        t0 = time.perf_counter()
        outs = llm.generate(  # type: ignore[attr-defined]
            token_prompts(prompts_of_step(s, args.batch)), params, use_tqdm=False
        )
        secs = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        steps.append({"generate_s": secs, "tokens": tokens, "tokens_per_s": tokens / secs})
        rate = tokens / secs
        print(f"seeded step {s}: {secs:.3f} s, {tokens} tokens, {rate:.0f} tok/s", flush=True)
    return {
        "steps": steps,
        "generate_s": median_after([x["generate_s"] for x in steps], 1),
        "tokens_per_s": median_after([x["tokens_per_s"] for x in steps], 1),
    }


def level_copies(kind: str) -> bool:
    """Whether a sleep kind copies the weights to the host and back (level 1)."""
    return kind.startswith("level1")


if __name__ == "__main__":
    sys.exit(main())
