"""Simulator workers: Gymnasium vector environments, stepped in pipeline stages.

An :class:`EnvWorker` process holds ``env.pipeline_stage_num`` vector environments (stages) of
``m`` sub-environments each. One rollout epoch (:meth:`EnvWorker.run_epoch`) sends every stage's
observations to the rollout workers through a bounded channel and steps each stage as soon as its
actions come back, so while stage ``s`` simulates, the rollout infers for the other stages:

    put obs(0), obs(1)
    for t in steps:  for s in stages:  get actions(s); step stage s; put obs(s)

Environments keep running across epochs (an episode may span two epochs), as in PPO's usual
vectorised rollouts. Sub-environments reset in the step that ends their episode (Gymnasium's
``SAME_STEP`` autoreset), so every recorded transition is a real one; the last observation of a
truncated episode is kept so the actor can bootstrap its value.

The worker keeps numpy arrays only: a CPU simulator holds no accelerator memory, so its residency
state is empty (a GPU simulator would declare its buffers in :meth:`EnvWorker.state_bytes`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rltrain.config.schema import RunConfig
from rltrain.config.seeds import env_rng_seed, env_stage_seed
from rltrain.errors import ConfigError, WorkerError
from rltrain.scheduler import Worker
from rltrain.telemetry import trace

#: Seconds a worker waits on a channel before giving up (its peer died or never started).
CHANNEL_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class SpaceSpec:
    """What the policy network needs to know about an environment's spaces.

    Attributes:
        env_id: the Gymnasium id.
        obs_dim: length of the flattened observation.
        action_kind: ``discrete`` (one of ``action_dim`` actions) or ``continuous``.
        action_dim: number of actions (discrete) or action dimensions (continuous).
        low: lower action bounds (continuous only).
        high: upper action bounds (continuous only).
    """

    env_id: str
    obs_dim: int
    action_kind: str
    action_dim: int
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()


@dataclass(frozen=True)
class ObsMessage:
    """env -> rollout: the current observations of one stage.

    Attributes:
        env_rank: the sending env process.
        stage: the stage within it.
        step: the epoch's time step (seeds the rollout's sampling).
        obs: ``[m, obs_dim]`` float32.
    """

    env_rank: int
    stage: int
    step: int
    obs: np.ndarray


@dataclass(frozen=True)
class ActionMessage:
    """rollout -> env: the sampled actions for one :class:`ObsMessage`.

    Attributes:
        actions: ``[m]`` int64 (discrete) or ``[m, action_dim]`` float32 (continuous, unclipped).
        logprobs: ``[m]`` float32 log-probabilities under the rollout's policy.
        version: the weight version that sampled them.
    """

    actions: np.ndarray
    logprobs: np.ndarray
    version: int


@dataclass(frozen=True)
class EnvRollout:
    """One env process's epoch, stages concatenated along the environment axis (``n = S * m``).

    Attributes:
        obs: ``[T, n, obs_dim]`` observation before each step.
        actions: ``[T, n]`` or ``[T, n, action_dim]``.
        logprobs: ``[T, n]`` behaviour log-probabilities.
        rewards: ``[T, n]``.
        dones: ``[T, n]`` 1.0 where the step ended the episode (terminated or truncated).
        truncated: ``[T, n]`` 1.0 where it ended by a time limit (the value is bootstrapped).
        final_obs: ``[T, n, obs_dim]`` last observation of a truncated episode (zeros elsewhere).
        last_obs: ``[n, obs_dim]`` observation after the last step (bootstraps the tail).
        episode_returns: returns of the episodes that ended in this epoch.
        episode_lengths: their lengths.
        versions: weight versions that sampled the epoch's actions (for staleness checks).
    """

    obs: np.ndarray
    actions: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    last_obs: np.ndarray
    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    versions: tuple[int, ...]

    @property
    def env_steps(self) -> int:
        return int(self.rewards.size)


@dataclass(frozen=True)
class EpochResult:
    """What the driver receives from :meth:`EnvWorker.collect`: a reference and small stats.

    Attributes:
        rollout: a one-element list holding the object ref of the :class:`EnvRollout` (a list,
            so Ray passes the ref on instead of fetching the data into the driver).
        env_steps: transitions in the epoch.
        episode_returns: returns of the episodes that ended in the epoch.
        episode_lengths: their lengths.
        versions: weight versions that sampled the epoch's actions.
        step_s: seconds spent stepping simulators (the ``env_step`` spans).
    """

    rollout: list[Any]
    env_steps: int
    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    versions: tuple[int, ...]
    step_s: float


def make_vector_env(env_id: str, num: int) -> Any:
    """A synchronous vector env of ``num`` copies, resetting in the step that ends an episode.

    Raises:
        ConfigError: the id is not a registered Gymnasium environment, or building it needs a
            package this machine lacks (Gymnasium's ``DependencyNotInstalled``, or an import
            error of its entry point's module).
    """
    import gymnasium as gym

    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        raise ConfigError(
            f"task.env_id={env_id!r} is not a registered Gymnasium environment ({exc}): use an id "
            f"such as CartPole-v1, or import the package that registers yours"
        ) from None
    try:
        return gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id) for _ in range(num)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    except (gym.error.DependencyNotInstalled, ImportError) as exc:
        # registered, but its simulator needs an extra (Box2D, MuJoCo, ...) this machine lacks
        raise ConfigError(
            f"task.env_id={env_id!r} cannot be built here ({exc}): install what it needs on "
            f"every node that runs env workers, or choose another task.env_id"
        ) from None


def probe_spaces(env_id: str) -> SpaceSpec:
    """Read an environment's observation and action spaces (builds and closes one copy).

    Raises:
        ConfigError: an unregistered id, a registered one whose simulator's package is
            missing, or spaces the policy network does not handle (observations must be a flat
            Box; actions Discrete or a flat Box).
    """
    import gymnasium as gym

    env = make_vector_env(env_id, 1)
    try:
        obs, act = env.single_observation_space, env.single_action_space
    finally:
        env.close()
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise ConfigError(
            f"task.env_id={env_id!r} has observations {obs}: the built-in policy takes a flat "
            f"Box; wrap the environment (e.g. FlattenObservation) and register the wrapped id"
        )
    if isinstance(act, gym.spaces.Discrete):
        return SpaceSpec(env_id, int(obs.shape[0]), "discrete", int(act.n))
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
        low, high = (tuple(float(x) for x in b) for b in (act.low, act.high))
        return SpaceSpec(env_id, int(obs.shape[0]), "continuous", int(act.shape[0]), low, high)
    raise ConfigError(
        f"task.env_id={env_id!r} has actions {act}: the built-in policy handles Discrete and "
        f"flat Box action spaces"
    )


class ChannelLink:
    """Overlaps a worker's channel traffic with its compute.

    A put is sent without waiting for the channel's answer (the worker goes on at once), and the
    next item the worker will need is asked for ahead while it computes, so a channel's round
    trips leave the pipeline's critical path. Both use the channel's non-blocking forms
    (``start_put`` / ``start_get``), not threads: a hand-off is one message to the channel and
    its answer to the waiting consumer, with no thread to wake on either side. Items keep their
    meaning whatever order they arrive in (each names its env rank and stage), and the next put
    for a key only follows the answer to the previous one.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.sends: list[Any] = []

    def send(self, channel: Any, item: Any, key: str) -> None:
        """Queue ``item`` under ``key`` in the background (errors surface at the next call)."""
        self._reap()
        self.sends.append(channel.start_put(item, key=key, timeout=CHANNEL_TIMEOUT_S))

    def ahead(self, channel: Any, key: str) -> Any:
        """Start fetching the next item of ``key``; ``receive`` it later."""
        return channel.start_get(key=key, timeout=CHANNEL_TIMEOUT_S)

    def receive(self, pending: Any, what: str) -> Any:
        """The item a future from :meth:`ahead` fetched.

        Raises:
            WorkerError: nothing arrived within ``CHANNEL_TIMEOUT_S`` (the peer stopped).
        """
        from rltrain.scheduler import ChannelTimeoutError

        try:
            return pending.result()
        except ChannelTimeoutError:
            raise WorkerError(
                f"{self.owner}: no {what} for {CHANNEL_TIMEOUT_S} s; the workers on the other "
                f"side of the channel stopped (see their errors)"
            ) from None

    def flush(self) -> None:
        """Wait until every background put was accepted (re-raising the first failure)."""
        sends, self.sends = self.sends, []
        for f in sends:
            f.result()

    def _reap(self) -> None:
        still = []
        for f in self.sends:
            if f.done():
                f.result()
            else:
                still.append(f)
        self.sends = still


def latency_s(rng: np.random.Generator, num: int, ms: float, jitter_ms: float) -> float:
    """Seconds of modelled device time for ``num`` items: ``ms`` each plus ``U(0, jitter_ms)``."""
    if ms <= 0 and jitter_ms <= 0:
        return 0.0
    extra = float(rng.uniform(0.0, jitter_ms, size=num).sum()) if jitter_ms > 0 else 0.0
    return (num * ms + extra) / 1000.0


class _Stage:
    """One group of ``m`` sub-environments and its running episode statistics."""

    def __init__(self, env_id: str, m: int, seed: int) -> None:
        self.env = make_vector_env(env_id, m)
        self.obs = self.env.reset(seed=seed)[0].astype(np.float32)
        self.ep_return = np.zeros(m, dtype=np.float64)
        self.ep_length = np.zeros(m, dtype=np.int64)


class EnvWorker(Worker):
    """One simulator process holding ``env.pipeline_stage_num`` stages of sub-environments.

    Args:
        run: the checked run config.
        spec: the environment's spaces (the driver probes them once).
        envs_per_stage: sub-environments per stage (``m``).
        rollout_world: rollout processes serving the stages (see :func:`stage_to_rollout`).
    """

    def __init__(
        self, run: RunConfig, spec: SpaceSpec, envs_per_stage: int, rollout_world: int
    ) -> None:
        self.run, self.spec, self.m = run, spec, envs_per_stage
        self.rollout_world = rollout_world
        self.num_stages = run.env.pipeline_stage_num
        self.stages = [
            _Stage(
                spec.env_id,
                envs_per_stage,
                env_stage_seed(run.seed, self.rank, self.num_stages, envs_per_stage, s),
            )
            for s in range(self.num_stages)
        ]
        self.rng = np.random.default_rng(env_rng_seed(run.seed, self.rank))
        self._step_s = 0.0  # seconds inside env steps during the current epoch
        self.link = ChannelLink(f"env rank {self.rank}")

    # ------------------------------------------------------------------------ residency
    def state_bytes(self) -> dict[str, int]:
        """Device bytes by state kind: none, a CPU simulator keeps its state in host memory."""
        return {}

    def offload(self, kinds: list[str]) -> int:
        """Nothing to move for a CPU simulator (see :meth:`state_bytes`)."""
        return 0

    def reload(self, kinds: list[str]) -> int:
        """Nothing to move for a CPU simulator (see :meth:`state_bytes`)."""
        return 0

    def memory_report(self) -> dict[str, Any]:
        """The ledger check of the model-holding workers: this worker declares and holds 0."""
        return {"declared": 0, "measured": 0, "offloaded": []}

    # --------------------------------------------------------------------------- epochs
    def run_epoch(self, obs_channel: Any, act_channel: Any, steps: int) -> EnvRollout:
        """Simulate ``steps`` steps of every stage, pipelined with the rollout workers.

        Args:
            obs_channel: channel to the rollout workers; items go to key ``rollout_key(...)``.
            act_channel: channel back; this process's stage ``s`` reads key ``"<rank>/<s>"``.
            steps: steps per sub-environment (``env.rollout_steps``).

        Returns:
            The epoch's transitions (see :class:`EnvRollout`).

        Raises:
            WorkerError: a channel stayed silent for ``CHANNEL_TIMEOUT_S`` (a peer died).
        """
        S, m, D = self.num_stages, self.m, self.spec.obs_dim
        rec = _Recorder(steps, S, m, D, self.spec)
        link = self.link
        for s, stage in enumerate(self.stages):
            self._send(obs_channel, s, 0, stage.obs)
        order = [(t, s) for t in range(steps) for s in range(S)]
        pending = link.ahead(act_channel, self._act_key(0))
        for i, (t, s) in enumerate(order):
            stage = self.stages[s]
            msg = link.receive(pending, f"actions for stage {s}")
            if i + 1 < len(order):  # fetch the next stage's actions while this one steps
                pending = link.ahead(act_channel, self._act_key(order[i + 1][1]))
            rec.before(t, s, stage.obs, msg)
            with trace.span("env_step", "env", self.device_labels):
                self._step(rec, t, s, stage, msg.actions)
            if t + 1 < steps:
                self._send(obs_channel, s, t + 1, stage.obs)
        link.flush()
        return rec.finish([st.obs for st in self.stages])

    def collect(self, obs_channel: Any, act_channel: Any, steps: int) -> EpochResult:
        """:meth:`run_epoch`, with the transitions left in the object store for the actor.

        Returns:
            A reference to the epoch's :class:`EnvRollout` and its small statistics.
        """
        import ray

        self._step_s = 0.0
        rollout = self.run_epoch(obs_channel, act_channel, steps)
        return EpochResult(
            rollout=[ray.put(rollout)],
            env_steps=rollout.env_steps,
            episode_returns=rollout.episode_returns,
            episode_lengths=rollout.episode_lengths,
            versions=rollout.versions,
            step_s=self._step_s,
        )

    def _step(self, rec: _Recorder, t: int, s: int, stage: _Stage, actions: np.ndarray) -> None:
        started = time.perf_counter()
        if self.spec.action_kind == "continuous":
            actions = np.clip(actions, self.spec.low, self.spec.high)
        obs, reward, term, trunc, info = stage.env.step(actions)
        obs = obs.astype(np.float32)
        done = np.logical_or(term, trunc)
        final = np.zeros_like(obs)
        cut = np.logical_and(trunc, np.logical_not(term))
        if cut.any():
            for i in np.flatnonzero(cut):
                final[i] = info["final_obs"][i]
        stage.ep_return += reward
        stage.ep_length += 1
        for i in np.flatnonzero(done):
            rec.episode(float(stage.ep_return[i]), int(stage.ep_length[i]))
        stage.ep_return[done] = 0.0
        stage.ep_length[done] = 0
        rec.after(t, s, reward, done, cut, final)
        stage.obs = obs
        # Modelled simulator time: the step's real work counts towards it.
        sim = self.run.simulate
        wait = latency_s(self.rng, self.m, sim.env_step_latency_ms, sim.env_step_jitter_ms)
        left = wait - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        self._step_s += time.perf_counter() - started

    def rollout_key(self, stage: int) -> str:
        """The rollout rank (as a channel key) serving ``stage`` of this process."""
        return str(stage_to_rollout(self.rank, stage, self.num_stages, self.rollout_world))

    def _send(self, channel: Any, stage: int, step: int, obs: np.ndarray) -> None:
        self.link.send(channel, ObsMessage(self.rank, stage, step, obs), self.rollout_key(stage))

    def _act_key(self, stage: int) -> str:
        return f"{self.rank}/{stage}"

    def close(self) -> None:
        """Close every vector environment."""
        for stage in self.stages:
            stage.env.close()


def stage_to_rollout(env_rank: int, stage: int, num_stages: int, rollout_world: int) -> int:
    """Which rollout rank serves a stage: stages round-robin over the rollout processes.

    Example: 1 env process with 2 stages and 2 rollout ranks -> stage 0 on rank 0, stage 1 on
    rank 1; 2 env processes x 2 stages on 1 rollout rank -> all four on rank 0.
    """
    return (env_rank * num_stages + stage) % rollout_world


class _Recorder:
    """Fills an epoch's arrays as stages step; stage ``s`` owns columns ``s*m .. s*m+m-1``."""

    def __init__(self, steps: int, S: int, m: int, D: int, spec: SpaceSpec) -> None:
        n = S * m
        self.m = m
        self.obs = np.zeros((steps, n, D), np.float32)
        shape = (steps, n) if spec.action_kind == "discrete" else (steps, n, spec.action_dim)
        self.actions = np.zeros(shape, np.int64 if spec.action_kind == "discrete" else np.float32)
        self.logprobs = np.zeros((steps, n), np.float32)
        self.rewards = np.zeros((steps, n), np.float32)
        self.dones = np.zeros((steps, n), np.float32)
        self.truncated = np.zeros((steps, n), np.float32)
        self.final_obs = np.zeros((steps, n, D), np.float32)
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.versions: set[int] = set()

    def _cols(self, s: int) -> slice:
        return slice(s * self.m, (s + 1) * self.m)

    def before(self, t: int, s: int, obs: np.ndarray, msg: ActionMessage) -> None:
        c = self._cols(s)
        self.obs[t, c] = obs
        self.actions[t, c] = msg.actions
        self.logprobs[t, c] = msg.logprobs
        self.versions.add(msg.version)

    def after(self, t: int, s: int, reward, done, cut, final) -> None:
        c = self._cols(s)
        self.rewards[t, c] = reward
        self.dones[t, c] = done
        self.truncated[t, c] = cut
        self.final_obs[t, c] = final

    def episode(self, ret: float, length: int) -> None:
        self.returns.append(ret)
        self.lengths.append(length)

    def finish(self, last: list[np.ndarray]) -> EnvRollout:
        return EnvRollout(
            obs=self.obs,
            actions=self.actions,
            logprobs=self.logprobs,
            rewards=self.rewards,
            dones=self.dones,
            truncated=self.truncated,
            final_obs=self.final_obs,
            last_obs=np.concatenate(last, axis=0),
            episode_returns=tuple(self.returns),
            episode_lengths=tuple(self.lengths),
            versions=tuple(sorted(self.versions)),
        )
