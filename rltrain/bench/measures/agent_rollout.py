"""Multi-turn tool rollouts (``task.env``): continuous batching against the naive loop and the
bound, for episodes of 1, 2, 4 and 8 tool calls.

One process, the torch engine, a tiny model briefly supervised to call the calculator of
``experiment=calc_tool`` on 2-term sums. A bench-only environment (:class:`ChainEnv`) asks for
a chain of ``calls`` calls: after each call but the last, its observation ends with the opening
of the next call (``=7;calculator[``), so the model writes another one. Every tool call waits
``simulate.tool_latency_ms`` = one turn's generation time for the whole batch (the generation
alone, divided by the turns an episode takes), and every call of the batch can run at once
(``tools.concurrency`` = episodes). Cases per chain length, all on the same episodes (sampling
draws per episode and turn, so every case samples the same tokens):

- ``bound``: generation alone (no tool latency): perfect overlap of the tools' latency with
  generation (the tools' own share, calls × latency, is below it);
- ``naive``: the next turn waits for every tool call of the batch;
- ``continuous, slots=all`` / ``slots=N/4``: continuous batching, every episode at once or a
  quarter of them decoding at once (``tools.slots``).

The goals (issue 32): continuous batching ≥ 0.9× the bound's episodes/s, and ≥ 1.5× the naive
loop's; the extras print each ratio and whether it is met (1) or not (0).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from rltrain.bench.harness import Case, Suite, measure
from rltrain.tasks.calc_tool import CalculatorEnv
from rltrain.tasks.tool_format import CALL_END, parse_call

#: The chain lengths (tool calls per episode) measured.
CHAINS = (1, 2, 4, 8)


class ChainEnv(CalculatorEnv):
    """The calculator, asked for a chain of :attr:`CALLS` calls (see the module docstring)."""

    CALLS = 1

    def reset(self, task: Any) -> str:
        self.calls = 0
        return super().reset(task)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if not action.endswith(CALL_END):  # a final answer
            return super().step(action)
        self.calls += 1
        call = action if parse_call(action) is not None else "calculator[" + action
        observation, reward, done, info = super().step(call)
        if self.calls < self.CALLS:
            observation += "calculator["
        return observation, reward, done, {**info, "tool": "calculator"}


#: ``task.env`` classes, one per chain length (``rltrain.bench.measures.agent_rollout:Chain2``).
CHAIN_ENVS = {n: type(f"Chain{n}", (ChainEnv,), {"CALLS": n}) for n in CHAINS}
globals().update({cls.__name__: cls for cls in CHAIN_ENVS.values()})


def _naive_class() -> type:
    from rltrain.agents.interaction import ToolEpisodes

    class NaiveEpisodes(ToolEpisodes):
        """The naive loop: a turn starts only once every tool call of the batch answered."""

        def _arrivals(self, waiting: list, ready: list, wait: bool) -> list:
            if not waiting or not wait:  # something still decodes: nobody rejoins yet
                return waiting
            for e in waiting:
                self._collect(e)
            ready.extend(e for e in waiting if not e.done)
            return []

    return NaiveEpisodes


@measure("agent_rollout", "multi-turn episodes/s (1-8 tool calls): continuous batching vs naive")
def agent_rollout(quick: bool) -> Suite:
    import torch

    from rltrain.agents.interaction import ToolEpisodes
    from rltrain.config.schema import ModelConfig, RunConfig
    from rltrain.tasks.base import Example
    from rltrain.tasks.calc_tool import ALPHABET, CalcToolSpec, sums, supervise
    from rltrain.tasks.model import build_model
    from rltrain.tasks.tokenizer import build_char_tokenizer

    torch.set_num_threads(1)
    spec = CalcToolSpec(
        num_train=80, num_eval=8, num_terms=2, digits=1, sft_steps=20 if quick else 80
    )
    train, _ = sums(spec)
    tok = build_char_tokenizer(ALPHABET)
    model = build_model(ModelConfig(vocab_chars=ALPHABET))
    supervise(model, tok, train, spec)
    examples = [Example(r["prompt"], r["answer"]) for r in train]
    task = type("Task", (), {"train": examples, "eval": []})
    prompts = [ex.prompt for ex in examples[: 2 if quick else 64]]
    n = len(prompts) * 4
    chains = CHAINS[:2] if quick else CHAINS
    naive = _naive_class()

    def episodes(calls: int, slots: int, latency_ms: float, cls: type = ToolEpisodes) -> Any:
        run = RunConfig()
        run.task.env = f"{__name__}:Chain{calls}"
        run.rollout.max_turns, run.rollout.max_new_tokens = calls + 1, 16
        run.rollout.max_total_tokens = 32 * (calls + 1)
        run.rollout.n_samples_per_prompt = 4
        run.tools.slots, run.tools.concurrency = slots, n
        run.simulate.tool_latency_ms = latency_ms
        return cls(run, lambda: model, tok, torch.device("cpu"), [tok.eos_token_id], task)

    warmup = 0 if quick else 1
    timings: dict[str, list[float]] = {}
    shape: dict[int, tuple[float, float, float]] = {}  # calls -> (latency ms, turns, calls)

    def timed(name: str, source: Any) -> Case:
        def call() -> None:
            start = time.perf_counter()
            source.generate(prompts, 0, True, None)
            timings.setdefault(name, []).append(time.perf_counter() - start)

        return Case(name, call, work=n, work_unit="episodes")

    cases = []
    for calls in chains:
        source = episodes(calls, 0, 0.0)
        source.generate(prompts, 0, True, None)  # warm
        start = time.perf_counter()
        batch = source.generate(prompts, 0, True, None)
        turns = float(batch.turns.float().mean())
        latency_ms = 1000 * (time.perf_counter() - start) / turns
        shape[calls] = (latency_ms, turns, float(batch.tool_calls.float().mean()))
        cases += [
            timed(f"{calls} calls: bound (no tool latency)", source),
            timed(f"{calls} calls: naive", episodes(calls, 0, latency_ms, naive)),
            timed(f"{calls} calls: continuous, slots=all", episodes(calls, 0, latency_ms)),
            timed(
                f"{calls} calls: continuous, slots={n // 4}", episodes(calls, n // 4, latency_ms)
            ),
        ]

    def extras() -> dict[str, float]:
        out: dict[str, float] = {}
        for calls in chains:
            latency_ms, turns, made = shape[calls]
            med = {  # the timed calls only (the first ``warmup`` of each case are not)
                k.split(": ", 1)[1]: statistics.median(v[warmup:] or v)
                for k, v in timings.items()
                if k.startswith(f"{calls} calls: ")
            }
            out[f"{calls} calls: tool latency ms"] = round(latency_ms, 1)
            out[f"{calls} calls: turns per episode"] = round(turns, 2)
            out[f"{calls} calls: tool calls per episode"] = round(made, 2)
            for slots in ("all", str(n // 4)):
                t = med[f"continuous, slots={slots}"]
                vs_bound = med["bound (no tool latency)"] / t
                vs_naive = med["naive"] / t
                out[f"{calls} calls, slots={slots}: x bound"] = round(vs_bound, 3)
                out[f"{calls} calls, slots={slots}: x naive"] = round(vs_naive, 3)
                out[f"{calls} calls, slots={slots}: goal >= 0.9x bound met"] = float(
                    vs_bound >= 0.9
                )
                out[f"{calls} calls, slots={slots}: goal >= 1.5x naive met"] = float(
                    vs_naive >= 1.5
                )
        return out

    return Suite(
        cases=tuple(cases),
        baseline=f"{chains[0]} calls: naive",
        warmup=warmup,
        repeats=1 if quick else 3,
        extras=extras,
        note=f"speed-up = 1/ratio; compare cases of the same chain length. {n} episodes, tool "
        f"latency per call = one turn's generation time for the batch (see the extras), every "
        f"call of the batch at once, 1 torch thread, one process.",
    )
