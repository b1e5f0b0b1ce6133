"""A tiny calculator agent and the run configs of the agent tests (tests/unit/agents): a model
briefly supervised to call the calculator, and a run whose task is an environment.

A uniquely named module in tests/ (on the test path, like ``composed``), so any test file can
import it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from rltrain.agents.interaction import ToolEpisodes
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.tasks.base import Example
from rltrain.tasks.calc_tool import ALPHABET, CalcToolSpec, sums, supervise
from rltrain.tasks.model import build_model
from rltrain.tasks.tokenizer import build_char_tokenizer

CALCULATOR = "rltrain.tasks.calc_tool:CalculatorEnv"


def supervised_agent(num_train: int, num_eval: int) -> tuple[Any, Any, SimpleNamespace]:
    """A tiny model briefly supervised on 2-term, 1-digit tool-call demonstrations (it calls
    the tool, so episodes take several turns), its tokenizer and task."""
    torch.set_num_threads(1)
    spec = CalcToolSpec(num_train=num_train, num_eval=num_eval, num_terms=2, digits=1, sft_steps=60)
    train, evals = sums(spec)
    tok = build_char_tokenizer(ALPHABET)
    model = build_model(ModelConfig(vocab_chars=ALPHABET, hidden_size=32, intermediate_size=64))
    supervise(model, tok, train, spec)
    task = SimpleNamespace(
        train=[Example(r["prompt"], r["answer"]) for r in train],
        eval=[Example(r["prompt"], r["answer"]) for r in evals],
    )
    return model, tok, task


def env_run(env: str = CALCULATOR, **over: object) -> RunConfig:
    """A run whose task is ``env``: 3 turns of at most 16 tokens, 4 samples a prompt, then
    ``section__key=value`` overrides."""
    run = RunConfig()
    run.task.env = env
    run.rollout.max_turns = 3
    run.rollout.max_new_tokens = 16
    run.rollout.n_samples_per_prompt = 4
    for key, value in over.items():
        section, name = key.split("__")
        setattr(getattr(run, section), name, value)
    return run


def episodes(
    agent: tuple[Any, Any, Any], run: RunConfig, pool: Any = None, model: Any = None
) -> ToolEpisodes:
    """The agent's episodes under ``run``, on the CPU (its own model unless ``model`` is
    given; the in-process tool pool unless ``pool`` is)."""
    m, tok, task = agent
    m = m if model is None else model
    return ToolEpisodes(run, lambda: m, tok, torch.device("cpu"), [tok.eos_token_id], task, pool)
