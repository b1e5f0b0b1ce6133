"""actor.backend=deepspeed in the real distributed reasoning trainer (2 actor ranks, gloo, CPU).

One collocated run of 3 steps with ZeRO-2 and torch AdamW, offloaded after every actor stage by
the residency coordinator; then, in the same job, a checkpoint written by every actor rank is
loaded back and a repeated update must reproduce the first one bit for bit (weights, optimizer
moments and master weights all restored).

DeepSpeed JIT-compiles its shared-memory comm op on first use (1-3.5 min on 2 busy cores): it is
cached in ``.torch_extensions`` (gitignored), which the workers find through
``cluster.runtime_env.env_vars.TORCH_EXTENSIONS_DIR``.
"""

from __future__ import annotations

import os
import pathlib

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.backends.training import EXTENSIONS_ENV, apply_extensions_dir
from rltrain.config import load_config
from rltrain.config.schema import RunConfig
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError
from rltrain.runners import reasoning
from rltrain.telemetry.metrics import read_metrics

pytestmark = pytest.mark.spread  # no module fixture: each test may run in either process

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXTENSIONS = os.environ.setdefault(EXTENSIONS_ENV, str(ROOT / ".torch_extensions"))
SHORT = (
    "trainer.total_steps=3",
    "trainer.eval_every=3",
    "trainer.train_batch_size=4",
    "logging.progress=false",
)
DEEPSPEED = (
    "actor.backend=deepspeed",
    "actor.zero_stage=2",
    f"+cluster.runtime_env.env_vars.{EXTENSIONS_ENV}='{EXTENSIONS}'",
)


def compose_run(*overrides: str) -> RunConfig:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=list(overrides)))


def test_deepspeed_limits_are_refused_before_ray(tmp_path, monkeypatch) -> None:
    pytest.importorskip("deepspeed")

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start for a config DeepSpeed cannot run")

    monkeypatch.setattr(reasoning, "start_job", no_ray)
    # The collocated placement offloads the actor: at ZeRO-0 only a plain float32 optimizer
    # can move (bfloat16 wraps it in DeepSpeed's mixed-precision optimizer).
    run = compose_run("actor.backend=deepspeed", "actor.zero_stage=0", "model.dtype=bfloat16")
    with pytest.raises(ConfigError, match="set actor.zero_stage to 1, 2 or 3"):
        reasoning.run_reasoning(run, str(tmp_path))
    run = compose_run("actor.backend=deepspeed", "actor.zero_stage=3", "model.dtype=float16")
    with pytest.raises(ConfigError) as err:
        reasoning.run_reasoning(run, str(tmp_path))
    assert "model.dtype='float16'" in str(err.value)
    assert "optimizer.name=deepspeed_adamw" in str(err.value)  # ZeRO-3 offload's fused Adam


@pytest.mark.timeout(600)
def test_deepspeed_runs_as_typed_on_the_shipped_placement(ray_session, tmp_path) -> None:
    """``actor.backend=deepspeed`` alone: the collocated placement (its actor offloads on
    demand) with the default actor.zero_stage=0, which offloads through a state mover."""
    pytest.importorskip("deepspeed")
    ray_session.ensure()
    run = compose_run(
        "actor.backend=deepspeed",
        "trainer.total_steps=2",
        "trainer.eval_every=2",
        "trainer.train_batch_size=4",
        "logging.progress=false",
        f"+cluster.runtime_env.env_vars.{EXTENSIONS_ENV}='{EXTENSIONS}'",
    )
    assert run.placement.mode == "collocated" and run.actor.zero_stage == 0
    summary = reasoning.run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["fused"] is False  # DeepSpeed trains in processes of its own
    assert any("actor.backend='deepspeed'" in b for b in summary["fuse_blockers"])
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert all(r["actor/lr"] == run.optimizer.lr for r in records)


def test_workers_take_the_extensions_dir_from_the_runtime_env(monkeypatch) -> None:
    monkeypatch.delenv(EXTENSIONS_ENV, raising=False)
    apply_extensions_dir(compose_run())  # no runtime_env: nothing set
    assert EXTENSIONS_ENV not in os.environ
    apply_extensions_dir(compose_run(*DEEPSPEED))
    assert os.environ[EXTENSIONS_ENV] == EXTENSIONS
    monkeypatch.setenv(EXTENSIONS_ENV, "/inherited")  # the worker's own value wins
    apply_extensions_dir(compose_run(*DEEPSPEED))
    assert os.environ[EXTENSIONS_ENV] == "/inherited"


def _fresh_rollout(runner: reasoning.ReasoningRunner, step: int) -> tuple[list, list]:
    """Shards and rewards of one more step, generated with the runner's current weights."""
    from rltrain.workers.reward import RewardWorker
    from rltrain.workers.rollout import RolloutWorker

    sizes, g = runner.sizes, runner.g
    prompts = [ex.prompt for ex in runner.task.sample_batch(step, sizes.prompts_per_step)]
    k = sizes.prompts_per_rollout_rank
    with runner.job.stage("rollout"):
        fut = g.rollout.call_each(
            RolloutWorker.generate,
            [
                (prompts[r * k : (r + 1) * k], step, runner.weights_ref, runner.version)
                for r in range(sizes.rollout_dp)
            ],
        )
        fut.wait()
    scores = g.reward.execute_on(0).call(RewardWorker.score, *fut.refs).wait()[0]
    return fut.refs, [sc.rewards for sc in scores]


def _exported(runner: reasoning.ReasoningRunner, version: int) -> dict[str, torch.Tensor]:
    """The weights the actor exports for the rollout (call inside the actor's lease)."""
    from rltrain.backends.weight_sync.host import load_from_host
    from rltrain.tasks.model import build_model

    model = build_model(runner.run.model)
    from rltrain.workers.actor import ActorWorker

    packed = runner.g.actor.execute_on(0).call(ActorWorker.export_weights, version).wait()[0]
    load_from_host(packed, dict(model.named_parameters()))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.timeout(600)
def test_collocated_deepspeed_trains_offloads_exports_and_resumes(
    ray_session, tmp_path, monkeypatch
) -> None:
    pytest.importorskip("deepspeed")
    from rltrain.tasks.model import build_model
    from rltrain.workers.actor import ActorWorker

    ray_session.ensure()
    seen: dict = {}
    real_fit = reasoning.ReasoningRunner.fit

    def fit(self):
        out = real_fit(self)
        seen["counts"] = self.job.residency.counts()
        shards, rewards = _fresh_rollout(self, 3)
        actor, ckpt = self.g.actor, str(tmp_path / "all_ranks")
        with self.job.stage("actor"):
            seen["exported"] = _exported(self, 3)
            actor.call(ActorWorker.save, ckpt).wait()  # every rank writes its ZeRO shard
            first = actor.call(ActorWorker.train, *shards, rewards=rewards, step=3).wait()
            seen["after_first"] = _exported(self, 4)
            actor.call(ActorWorker.load, ckpt).wait()
            again = actor.call(ActorWorker.train, *shards, rewards=rewards, step=3).wait()
            seen["after_again"] = _exported(self, 4)
        seen["first"], seen["again"] = first, again
        return out

    monkeypatch.setattr(reasoning.ReasoningRunner, "fit", fit)
    # 3 steps of an untrained policy score 0 everywhere (zero advantages): the entropy bonus
    # gives every update a gradient, so "the weights moved" and "bit for bit" mean something.
    run = compose_run(
        "placement=collocated",
        "placement.offload.actor.when=after_stage",  # RLinf's turns: every stage moves state
        "algorithm.entropy_coef=0.05",
        *SHORT,
        *DEEPSPEED,
    )
    summary = reasoning.run_reasoning(run, str(tmp_path))  # also checks the memory ledger

    assert summary["status"] == "completed" and summary["steps"] == 3
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in records)
    assert all(r["actor/grad_norm"] > 0 for r in records)
    # the coordinator drove DeepSpeed's offload_states/reload_states through offload()/reload()
    counts = seen["counts"]
    assert counts[("actor", "offload")] >= 2 * 3 and counts[("actor", "reload")] >= 2 * 3
    # the rollout got the trained weights: the export equals the final checkpoint, bit for bit,
    # and differs from the initial model
    from safetensors.torch import load_file

    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    saved = load_file(str(tmp_path / "checkpoints" / latest / "model" / "model.safetensors"))
    initial = dict(build_model(run.model).named_parameters())
    exported = seen["exported"]
    assert all(torch.equal(exported[n], saved[n]) for n in saved)
    assert any(not torch.equal(exported[n], initial[n]) for n in saved)
    # resume: same batch from the restored state -> the same update, bit for bit, on each rank
    for a, b in zip(seen["first"], seen["again"], strict=True):
        assert a.metrics["actor/pg_loss"] == b.metrics["actor/pg_loss"]
        assert a.metrics["actor/grad_norm"] == b.metrics["actor/grad_norm"]
    after_first, after_again = seen["after_first"], seen["after_again"]
    assert any(not torch.equal(after_first[n], exported[n]) for n in exported)  # it moved
    assert all(torch.equal(after_first[n], after_again[n]) for n in exported)
    assert sorted(os.listdir(tmp_path / "all_ranks" / "optimizer")) == [
        "zero_rank0.pt",
        "zero_rank1.pt",
    ]


def test_ledger_of_a_deepspeed_actor_on_simulated_devices(monkeypatch) -> None:
    """Offload on CPU is host to host in place: the engine's bytes come from its ledger, and the
    walk still catches a tensor the worker keeps outside the engine."""
    pytest.importorskip("deepspeed")
    import torch.distributed as dist

    from rltrain.errors import WorkerError
    from rltrain.placement.sizes import derive_sizes
    from rltrain.workers.actor import ActorWorker

    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)  # init_distributed sets them; undone after
    run = compose_run(*DEEPSPEED)
    worker = ActorWorker(run, derive_sizes(run, 1, 1))  # a plain object: rank 0 of 1
    with pytest.raises(WorkerError, match="after group.init_process_group"):
        worker.offload(["optimizer"])  # the engine is built by setup_data_parallel()
    try:
        worker.setup_data_parallel()  # a gloo world of one in this process
        total = worker.state_bytes()
        params = sum(p.numel() for p in worker.model.parameters())
        # before a step: the fp32 weights (+ a rotary buffer) and the fp32 master copy
        assert total["optimizer"] == 4 * params and total["weights"] >= 4 * params
        assert worker.memory_report()["declared"] == sum(total.values())
        assert worker.offload(["weights", "optimizer", "kv_cache"]) == (
            total["weights"] + total["optimizer"]
        )
        report = worker.memory_report()
        assert report["declared"] == 0 and report["offloaded"] == ["optimizer", "weights"]
        worker.scratch = torch.zeros(1_000_000)  # 4 MB outside the engine
        with pytest.raises(WorkerError, match="outside its training engine"):
            worker.memory_report()
        del worker.scratch
        assert worker.reload(["weights"]) == total["weights"] + total["optimizer"]  # all back
        assert worker.state_bytes() == total
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
