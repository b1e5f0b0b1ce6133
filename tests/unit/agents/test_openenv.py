"""OpenEnv environments through task.env: OpenEnv's own server and client on loopback give the
same episodes, token for token, as the same environment in-process.

OpenEnv is imported by the ``serving`` fixture, not at collection: its server stack (FastAPI,
Gradio, MCP) costs seconds of CPU, and every test process collects every module.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from rltrain.agents.interaction import ToolEpisodes
from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.tasks.base import Example
from rltrain.tasks.calc_tool import ALPHABET, CalcToolSpec, sums, supervise
from rltrain.tasks.model import build_model
from rltrain.tasks.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def serving() -> Callable:
    """``openenv_loopback.serving``: OpenEnv's own server on loopback (skips without it)."""
    pytest.importorskip("openenv.core", reason="openenv-core is in the dev extra")
    import openenv_loopback

    return openenv_loopback.serving


@pytest.fixture(scope="module")
def policy():
    """A tiny model briefly supervised on calculator calls, so turns end in a call or EOS."""
    torch.manual_seed(0)
    spec = CalcToolSpec(num_train=64, num_eval=4, num_terms=2, digits=1, sft_steps=30)
    train, _ = sums(spec)
    tok = build_char_tokenizer(ALPHABET)
    model = build_model(ModelConfig(vocab_chars=ALPHABET))
    supervise(model, tok, train, spec)
    rows = [Example(r["prompt"], r["answer"]) for r in train[:4]]
    return model, tok, rows


def _episodes(env: str, policy) -> ToolEpisodes:
    model, tok, rows = policy
    run = RunConfig()
    run.task.env = env
    run.rollout.max_turns, run.rollout.max_new_tokens, run.rollout.n_samples_per_prompt = 3, 16, 4
    task = type("Task", (), {"train": rows, "eval": rows})()
    return ToolEpisodes(run, lambda: model, tok, torch.device("cpu"), [tok.eos_token_id], task)


def test_an_openenv_server_runs_the_same_episodes_as_the_env_in_process(policy, serving):
    prompts = [ex.prompt for ex in policy[2]]
    twin = _episodes("openenv_loopback:TwinEnv", policy).generate(prompts, 7, True, None)
    with serving():
        served = _episodes("openenv_loopback:LoopbackEnv", policy).generate(prompts, 7, True, None)
    assert served.tool_calls.sum() > 0  # the server's first step ran as a tool
    assert not served.infra_failed.any()
    for field in ("response_ids", "response_mask", "loss_mask", "env_rewards", "turns"):
        assert torch.equal(getattr(served, field), getattr(twin, field)), field
    assert torch.equal(served.tool_calls, twin.tool_calls)


def test_a_step_the_server_fails_infra_fails_its_episodes_and_the_rest_go_on(policy, serving):
    model, tok, rows = policy
    broken = [Example(rows[0].prompt, "boom"), *rows[1:]]
    prompts = [ex.prompt for ex in broken]
    with serving():
        batch = _episodes("openenv_loopback:LoopbackEnv", (model, tok, broken)).generate(
            prompts, 7, True, None
        )
    failed = batch.infra_failed.view(len(prompts), -1)
    stepped = ~batch.truncated.view(len(prompts), -1)  # the others' budget ended their turn
    assert failed[0].any() and torch.equal(failed[0], stepped[0])  # every step on row 0 failed
    assert not failed[1:].any()  # the other rows' episodes went on
    assert not batch.loss_mask.view(len(prompts), 4, -1)[0][failed[0]].any()  # out of the loss
