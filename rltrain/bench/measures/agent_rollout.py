"""Multi-turn tool rollouts (``task.env``): interleaved tool calls against a naive loop.

One process, the torch engine, a tiny model briefly supervised to call the calculator of
``experiment=calc_tool`` (2-term sums, so every episode calls it), 3 turns at most. Each tool
call waits ``simulate.tool_latency_ms`` (a slow sandbox). Cases, all on the same model and
prompts (same episodes: sampling is seeded per part and turn):

- ``no tool latency``: generation alone, the bound's generation term;
- ``interleave=1``: the naive loop, every tool call waits for the whole batch to stop, and
  the next turn waits for every call;
- ``interleave=2`` / ``4``: while one part's tool calls run, the other parts generate.

The tool latency is one turn's generation time for the whole batch. An episode here calls the
tool once (call, answer): the naive loop pays ``2g + L`` per batch (``g`` a turn's generation,
``L`` the latency), perfect overlap ``2g`` (the bound); ``k`` parts hide up to ``(k-1)/k`` of
``g`` of the latency.
"""

from __future__ import annotations

from rltrain.bench.harness import Case, Suite, measure


@measure("agent_rollout", "multi-turn episodes/s: interleaved tool calls vs the naive loop")
def agent_rollout(quick: bool) -> Suite:
    import time
    from types import SimpleNamespace

    import torch

    from rltrain.agents.interaction import ToolEpisodes
    from rltrain.config.schema import ModelConfig, RunConfig
    from rltrain.tasks.base import Example
    from rltrain.tasks.calc_tool import ALPHABET, CalcToolSpec, sums, supervise
    from rltrain.tasks.model import build_model
    from rltrain.tasks.tokenizer import build_char_tokenizer

    torch.set_num_threads(1)
    spec = CalcToolSpec(
        num_train=80, num_eval=8, num_terms=2, digits=1, sft_steps=40 if quick else 80
    )
    train, evals = sums(spec)
    tok = build_char_tokenizer(ALPHABET)
    model = build_model(ModelConfig(vocab_chars=ALPHABET))
    supervise(model, tok, train, spec)
    task = SimpleNamespace(
        train=[Example(r["prompt"], r["answer"]) for r in train],
        eval=[Example(r["prompt"], r["answer"]) for r in evals],
    )
    prompts = [ex.prompt for ex in task.train[: 4 if quick else 16]]

    def episodes(interleave: int, latency_ms: float) -> ToolEpisodes:
        run = RunConfig()
        run.task.env = "rltrain.tasks.calc_tool:CalculatorEnv"
        run.rollout.max_turns, run.rollout.max_new_tokens = 3, 16
        run.rollout.n_samples_per_prompt = 4
        run.tools.interleave, run.tools.concurrency = interleave, 64
        run.simulate.tool_latency_ms = latency_ms
        return ToolEpisodes(run, lambda: model, tok, torch.device("cpu"), [tok.eos_token_id], task)

    # the tool latency: one turn's generation time for the whole batch, measured here
    start = time.perf_counter()
    episodes(1, 0.0).generate(prompts, 0, True, None)
    gen_s = time.perf_counter() - start
    latency_ms = 1000 * gen_s / 2  # two turns per episode (call, answer): one turn's time
    cases = {
        "no tool latency": episodes(1, 0.0),
        "interleave=1 (naive)": episodes(1, latency_ms),
        "interleave=2": episodes(2, latency_ms),
        "interleave=4": episodes(4, latency_ms),
    }
    n = len(prompts) * 4

    def run(name: str):
        return lambda: cases[name].generate(prompts, 0, True, None)

    return Suite(
        cases=tuple(Case(k, run(k), work=n, work_unit="episodes") for k in cases),
        baseline="interleave=1 (naive)",
        warmup=1,
        repeats=2 if quick else 5,
        note=f"speed-up = 1/ratio. Tool latency {latency_ms:.0f} ms per call (one turn's "
        f"generation); 'no tool latency' is the bound (perfect overlap); {n} episodes, one "
        f"call each, 1 torch thread, one process.",
    )
