"""``plain_grpo``: the stand-alone GRPO loop (``rltrain/bench/plain_grpo.py``) on all cores.

Cases: a fixed number of GRPO steps (the baseline; throughput in sampled sequences per second;
five timed runs after one warm-up run) and, for three named seeds (one run each: the seeds are the
spread), the time from a random initialisation to greedy evaluation
accuracy >= 0.9 (evaluations included). A seed that does not reach the target within the default
``trainer.total_steps`` fails the measure instead of reporting a time. Each seed varies both the
sampling seed and ``model.init_seed``.
"""

from __future__ import annotations

import os

from rltrain.bench.harness import Case, Suite, measure

SEEDS = (1, 2, 3)
TARGET = 0.9


def _script():
    from rltrain.bench import plain_grpo

    return plain_grpo


def _fixed_steps(steps: int, warmup: int = 0, repeats: int = 1) -> Case:
    def run() -> None:
        _script().main(["--steps", str(steps), "--eval-every", str(steps)])

    d = _script().DEFAULTS
    work = steps * d["train_batch_size"] * d["n_samples_per_prompt"]
    return Case(
        f"steps={steps}",
        run,
        size=steps,
        work=work,
        work_unit="sequences",
        warmup=warmup,
        repeats=repeats,
    )


def _to_target(seed: int, target: float) -> Case:
    def run() -> None:
        args = ["--seed", str(seed), "--init-seed", str(seed), "--target-accuracy", str(target)]
        result = _script().main(args)
        if result["time_to_target_s"] is None:
            raise RuntimeError(
                f"plain GRPO seed {seed} did not reach accuracy {target} in {result['steps']} "
                f"steps (final {result['final_accuracy']}): {result['curve']}"
            )

    return Case(f"seed={seed} to acc>={target}", run)


@measure("plain_grpo", "plain single-process GRPO: step throughput and time to 0.9 accuracy")
def plain_grpo(quick: bool) -> Suite:
    if quick:
        cases = (_fixed_steps(1), _fixed_steps(2))
    else:
        # A few seconds per run: worth a warm-up and a spread; a seed's run to the target is not.
        cases = (_fixed_steps(50, warmup=1, repeats=5), *(_to_target(s, TARGET) for s in SEEDS))
    return Suite(
        cases=cases,
        baseline=cases[0].name,
        warmup=0,
        repeats=1,
        note=(
            f"torch threads = {os.cpu_count()} (all cores). Target: every seed reaches accuracy "
            f">= {TARGET} within about 2 minutes on 2 CPU cores; report the slowest seed."
        ),
    )
