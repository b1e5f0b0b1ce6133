"""experiment=gsm8k_tiny learns: RL raises greedy accuracy by 0.10 or more over its base.

The preset exactly as shipped (its generated data and base checkpoint, its sampling, batch,
learning rate and step count), trained by rltrain's own algorithm pieces in one process: the
update a run's actor takes, without Ray (``test_gsm8k_tiny.py`` runs the preset through Ray).
The data and checkpoint come from the test run's shared cache (``tests/shared_cache.py``): the
bytes the preset writes, generated once for this test and ``test_doc_commands``.
"""

from __future__ import annotations

import pathlib

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from shared_cache import shared_cache

from rltrain.algorithms import (
    SamplingParams,
    UpdateSettings,
    add_advantages,
    decode_responses,
    encode_prompts,
    generate,
    greedy_accuracy,
    ppo_update,
)
from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.tasks import build_task, build_tokenizer, prepare_task
from rltrain.tasks.model import build_model

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rl_raises_greedy_accuracy_over_the_base_in_the_documented_steps(
    tmp_path_factory, monkeypatch
):
    # the preset's data as shipped, generated once per test run (test_doc_commands reads it too)
    monkeypatch.setenv("RLTRAIN_CACHE", str(shared_cache(tmp_path_factory)))
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        run = load_config(compose(config_name="config", overrides=["experiment=gsm8k_tiny"]))
    prepare_task(run)
    tok = build_tokenizer(run.model)
    task = build_task(run.task, tok)
    model = build_model(run.model)
    budget = run.rollout.max_new_tokens
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a run's actor on a 2-core machine
    try:
        base = greedy_accuracy(model, tok, task, budget)
        _train(run, model, tok, task)
        after = greedy_accuracy(model, tok, task, budget)
    finally:
        torch.set_num_threads(threads)
    assert after >= base + 0.10, f"greedy accuracy {base:.3f} -> {after:.3f}"


def _train(run, model, tok, task) -> None:
    """``trainer.total_steps`` GRPO steps with the preset's settings."""
    opt = run.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, weight_decay=0.0
    )
    settings = UpdateSettings.from_config(run)
    params = SamplingParams.from_rollout(run.rollout)
    gen = torch.Generator().manual_seed(run.seed)
    group = params.n
    for step in range(run.trainer.total_steps):
        examples = task.sample_batch(step, run.trainer.train_batch_size)
        ids, mask = encode_prompts(tok, [e.prompt for e in examples])
        batch = generate(model, ids, mask, params, tok.eos_token_id, tok.pad_token_id, gen)
        texts = decode_responses(tok, batch, tok.eos_token_id)
        rewards = torch.tensor(
            [task.reward(examples[i // group].prompt, t) for i, t in enumerate(texts)]
        )
        batch = add_advantages(batch.replace(rewards=rewards), settings)
        ppo_update(model, optimizer, batch, settings, generator=gen)
