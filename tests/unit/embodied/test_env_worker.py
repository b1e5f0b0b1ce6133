"""The env worker's epoch outside Ray: in-process channels wire it to a real rollout worker."""

from __future__ import annotations

import pathlib
import queue
import threading

import gymnasium as gym
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError
from rltrain.workers.embodied import EmbodiedRolloutWorker
from rltrain.workers.env import EnvWorker, latency_s, probe_spaces, stage_to_rollout

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
SHORT_CARTPOLE = "TinyCartPole-v0"


def compose_run(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(
            compose(config_name="config", overrides=["experiment=cartpole_hybrid", *overrides])
        )


class Done:
    """A finished put: what ``Channel.start_put`` returns once the channel accepted the item."""

    def done(self) -> bool:
        return True

    def result(self, timeout=None) -> None:
        return None


class Later:
    """A get that blocks on the queue when its result is asked for."""

    def __init__(self, q: queue.Queue) -> None:
        self.q = q

    def done(self) -> bool:
        return not self.q.empty()

    def result(self, timeout=None):
        return self.q.get(timeout=timeout)


class Queue:
    """A channel stand-in with the worker-facing part of the Channel API: per-key FIFOs with
    the non-blocking forms the workers use (``start_put`` / ``start_get``)."""

    def __init__(self) -> None:
        self.items: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()

    def _q(self, key: str) -> queue.Queue:
        with self.lock:
            return self.items.setdefault(key, queue.Queue())

    def put(self, item, key="default", timeout=None):
        self._q(key).put(item)

    def start_put(self, item, key="default", timeout=None):
        self.put(item, key=key, timeout=timeout)
        return Done()

    def start_get(self, key="default", timeout=None):
        return Later(self._q(key))


class Answering(Queue):
    """The obs channel: a rollout worker answers each item as soon as it is queued."""

    def __init__(self, rollout: EmbodiedRolloutWorker, act: Queue, epoch: int) -> None:
        super().__init__()
        self.rollout, self.act, self.epoch, self.keys = rollout, act, epoch, []

    def put(self, item, key="default", timeout=None):
        with self.lock:
            self.keys.append(key)
        self.act.put(self.rollout.infer(item, self.epoch), key=f"{item.env_rank}/{item.stage}")


def epoch(run, steps: int, env: EnvWorker | None = None):
    spec = probe_spaces(run.task.env_id)
    env = env or EnvWorker(run, spec, run.env.num_envs // run.env.pipeline_stage_num, 1)
    act = Queue()
    obs = Answering(EmbodiedRolloutWorker(run, spec), act, 0)
    return env.run_epoch(obs, act, steps), obs.keys, env


def test_an_epoch_records_every_stage_and_episode():
    run = compose_run("env.num_envs=4", "env.pipeline_stage_num=2")
    roll, keys, _ = epoch(run, 40)
    assert roll.obs.shape == (40, 4, 4) and roll.actions.shape == (40, 4)
    assert roll.env_steps == 160 and roll.last_obs.shape == (4, 4)
    assert set(np.unique(roll.actions)) <= {0, 1}
    assert np.all(roll.rewards == 1.0)  # CartPole pays 1 per step
    # a random policy ends episodes within 40 steps; CartPole's return is its length
    assert roll.dones.sum() == len(roll.episode_returns) > 0
    assert roll.episode_returns == pytest.approx(roll.episode_lengths)
    assert len(roll.versions) == 1  # one weight version sampled the whole epoch
    # 2 stages x 40 steps items, all to rollout rank 0 (one rollout process)
    assert keys == ["0"] * 80


def test_epochs_are_reproducible_and_continue_episodes():
    run = compose_run("env.num_envs=2", "env.pipeline_stage_num=1")
    first, _, env = epoch(run, 10)
    again, _, _ = epoch(run, 10)
    assert np.array_equal(first.obs, again.obs) and np.array_equal(first.actions, again.actions)
    second, _, _ = epoch(run, 10, env)
    # the next epoch starts where the last one stopped, not from a reset
    assert np.array_equal(second.obs[0], first.last_obs)


def test_time_limit_truncation_keeps_the_final_observation():
    if SHORT_CARTPOLE not in gym.registry:
        gym.register(
            SHORT_CARTPOLE,
            entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            max_episode_steps=3,
        )
    run = compose_run(f"task.env_id={SHORT_CARTPOLE}", "env.num_envs=2", "env.pipeline_stage_num=1")
    roll, _, _ = epoch(run, 6)
    cut = roll.truncated.astype(bool)
    assert cut.any()
    assert np.all(roll.dones[cut] == 1.0)
    assert np.all(np.abs(roll.final_obs[cut]).sum(-1) > 0)
    assert np.all(roll.final_obs[~cut] == 0)
    # after a cut the next observation is a fresh reset: small, unlike the final one
    t, i = np.argwhere(cut)[0]
    if t + 1 < 6:
        assert np.all(np.abs(roll.obs[t + 1, i]) <= 0.05)


def test_unknown_and_unsupported_environments_are_refused_with_the_key():
    with pytest.raises(ConfigError, match="task.env_id='NoSuchEnv-v0'"):
        probe_spaces("NoSuchEnv-v0")
    spec = probe_spaces("Pendulum-v1")
    assert spec.action_kind == "continuous" and spec.low == (-2.0,) and spec.obs_dim == 3


def _needs_an_extra(**kwargs):
    raise gym.error.DependencyNotInstalled("SimX is not installed, pip install simx")


def test_a_registered_environment_missing_its_simulator_is_refused_with_the_key():
    # registered as Box2D's and MuJoCo's ids are, but building it needs a package not here
    gym.register(id="RltrainNeedsSimX-v0", entry_point=_needs_an_extra)
    try:
        with pytest.raises(
            ConfigError,
            match=r"task.env_id='RltrainNeedsSimX-v0' cannot be "
            r"built here \(SimX is not installed.*choose another task.env_id",
        ):
            probe_spaces("RltrainNeedsSimX-v0")
    finally:
        gym.registry.pop("RltrainNeedsSimX-v0", None)
    # a third-party id whose entry point's module is not installed
    gym.register(id="RltrainNoModule-v0", entry_point="rltrain_no_such_sim.envs:Env")
    try:
        with pytest.raises(ConfigError, match=r"task.env_id='RltrainNoModule-v0' cannot be built"):
            probe_spaces("RltrainNoModule-v0")
    finally:
        gym.registry.pop("RltrainNoModule-v0", None)


def test_latency_is_per_environment_with_bounded_jitter():
    rng = np.random.default_rng(0)
    assert latency_s(rng, 4, 2.5, 0.0) == pytest.approx(0.010)
    assert latency_s(rng, 4, 0.0, 0.0) == 0.0
    draws = [latency_s(rng, 4, 1.0, 2.0) for _ in range(50)]
    assert all(0.004 <= d <= 0.012 for d in draws) and len(set(draws)) > 1


def test_stages_round_robin_over_rollout_ranks():
    assert [stage_to_rollout(0, s, 2, 2) for s in range(2)] == [0, 1]
    assert [stage_to_rollout(e, s, 2, 1) for e in range(2) for s in range(2)] == [0, 0, 0, 0]
    assert [stage_to_rollout(e, s, 2, 3) for e in range(2) for s in range(2)] == [0, 1, 2, 0]
