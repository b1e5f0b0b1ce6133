"""The embodied policy and its workers: a small actor-critic MLP, rollout and PPO actor.

- :class:`ActorCritic`: separate policy and value MLPs (``model.num_layers`` hidden layers of
  ``model.hidden_size``, tanh), categorical actions for Discrete spaces, a diagonal Gaussian with a
  learned log-std for Box spaces.
- :func:`episode_gae`: GAE over ``[T, N]`` time-major rewards with episode ends inside the epoch.
- :class:`EmbodiedRolloutWorker`: serves observation items from the env workers' channel with
  the latest weights, answering each with sampled actions; also runs greedy evaluation.
- :class:`EmbodiedActorWorker`: PPO + GAE on the env workers' epochs, data-parallel over its
  processes; exports weights for the rollout.

Sampling is seeded per item (seed, epoch, env rank, stage, step), so which rollout rank serves an
item, and in which order, does not change the actions: runs are reproducible.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algorithms.embodied_ppo import PPOSettings, build_transitions, ppo_epochs
from rltrain.backends.offload import StateMover
from rltrain.backends.weight_sync.host import HostBuckets, load_from_host, pack_to_host
from rltrain.config import seeds
from rltrain.config.schema import RunConfig
from rltrain.scheduler import Worker
from rltrain.telemetry import trace
from rltrain.workers.common import (
    ResidentState,
    TrainResult,
    compute_device,
    fetched_dir,
    local_dir,
    seed_everything,
)
from rltrain.workers.env import (
    ActionMessage,
    ChannelLink,
    ObsMessage,
    SpaceSpec,
    latency_s,
    make_vector_env,
)


# ------------------------------------------------------------------------------------ network
def _mlp(inp: int, hidden: int, layers: int, out: int, out_gain: float) -> nn.Sequential:
    mods: list[nn.Module] = []
    width = inp
    for _ in range(layers):
        lin = nn.Linear(width, hidden)
        nn.init.orthogonal_(lin.weight, math.sqrt(2))
        nn.init.zeros_(lin.bias)
        mods += [lin, nn.Tanh()]
        width = hidden
    head = nn.Linear(width, out)
    # Small policy-head weights start the policy near uniform (PPO implementation detail).
    nn.init.orthogonal_(head.weight, out_gain)
    nn.init.zeros_(head.bias)
    mods.append(head)
    return nn.Sequential(*mods)


class ActorCritic(nn.Module):
    """Policy and value MLPs over flat observations.

    Args:
        spec: the environment's spaces.
        hidden: hidden width (``model.hidden_size``).
        layers: hidden layers per MLP (``model.num_layers``).
    """

    def __init__(self, spec: SpaceSpec, hidden: int, layers: int) -> None:
        super().__init__()
        self.spec = spec
        self.policy = _mlp(spec.obs_dim, hidden, layers, spec.action_dim, 0.01)
        self.critic = _mlp(spec.obs_dim, hidden, layers, 1, 1.0)
        self.log_std = (
            nn.Parameter(torch.zeros(spec.action_dim)) if spec.action_kind == "continuous" else None
        )

    def distribution(self, obs: Tensor) -> torch.distributions.Distribution:
        """The action distribution at ``obs`` (``[B, obs_dim]``)."""
        out = self.policy(obs)
        if self.log_std is None:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))

    def value(self, obs: Tensor) -> Tensor:
        """``[B]`` state values."""
        return self.critic(obs).squeeze(-1)

    def forward(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of ``actions``, entropies and values, each ``[B]`` (for training)."""
        dist = self.distribution(obs)
        logp, ent = dist.log_prob(actions), dist.entropy()
        if self.log_std is not None:
            logp, ent = logp.sum(-1), ent.sum(-1)
        return logp, ent, self.value(obs)

    @torch.no_grad()
    def act(
        self, obs: Tensor, generator: torch.Generator | None = None, greedy: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Sample (or, greedy, pick the most likely) actions; returns ``(actions, logprobs)``."""
        dist = self.distribution(obs)
        if self.log_std is None:
            probs = dist.probs
            actions = probs.argmax(-1) if greedy else categorical_draw(probs, generator)
            return actions, dist.log_prob(actions)
        mean = dist.mean
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        actions = mean if greedy else mean + dist.stddev * noise.to(mean.device)
        return actions, dist.log_prob(actions).sum(-1)


def categorical_draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One action per row of ``probs`` (``[B, A]``), drawn as ``torch.multinomial(probs, 1)``
    draws it: the exponential race ``argmax(p / q)``, ``q ~ Exp(1)``, with ``q`` drawn where
    ``generator`` lives. An item's generator is a host one (:meth:`EmbodiedRolloutWorker.infer`),
    which ``torch.multinomial`` refuses for probabilities on a GPU; drawn on the host, the race
    picks the same actions on any device (on CPU, exactly ``torch.multinomial``'s).

    Args:
        probs: ``[B, A]`` action probabilities, on the policy's device.
        generator: the item's random source (None: the global one of ``probs``' device).

    Returns:
        ``[B]`` long actions, on ``probs``' device.
    """
    where = probs.device if generator is None else generator.device
    race = torch.empty(probs.shape, dtype=probs.dtype, device=where)
    race.exponential_(1, generator=generator)
    return (probs / race.to(probs.device)).argmax(-1)


def build_policy(run: RunConfig, spec: SpaceSpec) -> ActorCritic:
    """The run's actor-critic, initialised from ``model.init_seed`` (identical on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run.model.init_seed)
        return ActorCritic(spec, run.model.hidden_size, run.model.num_layers)


def item_seed(seed: int, epoch: int, env_rank: int, stage: int, step: int) -> int:
    """The sampling seed of one observation item (independent of the serving rollout rank)."""
    return seeds.item_seed(seed, epoch, env_rank, stage, step)


# ------------------------------------------------------------------------------------ workers
class EmbodiedRolloutWorker(Worker, ResidentState):
    """Runs the policy for observation items from the env workers; holds no optimizer.

    Args:
        run: the checked run config.
        spec: the environment's spaces.
    """

    def __init__(self, run: RunConfig, spec: SpaceSpec) -> None:
        self.run, self.spec = run, spec
        self.device = compute_device(self)
        self.model = build_policy(run, spec).to(self.device)
        self.model.requires_grad_(False)
        self.mover = StateMover(self.model, None, device=self.device)
        self.version = -1  # loads the actor's first export even though the init matches
        self.rng = np.random.default_rng(seeds.policy_rng_seed(run.seed, self.rank))
        self.link = ChannelLink(f"rollout rank {self.rank}")

    def _sync(self, weights: HostBuckets | None) -> None:
        if weights is not None and weights.version != self.version:
            with trace.span("sync", "rollout", self.device_labels):
                load_from_host(weights, dict(self.model.named_parameters()))
            self.version = weights.version

    def serve(
        self,
        obs_channel: Any,
        act_channel: Any,
        num_items: int,
        epoch: int,
        weights: HostBuckets | None = None,
    ) -> dict[str, float]:
        """Answer ``num_items`` observation items of this rank's key with sampled actions.

        Args:
            obs_channel: items arrive under key ``str(rank)``.
            act_channel: answers go to key ``"<env rank>/<stage>"``.
            num_items: items this rank serves this epoch.
            epoch: the policy-update index (seeds sampling).
            weights: the weights to act with (loaded when newer than the held version).

        Returns:
            ``{"items": n, "infer_s": seconds inside inference}``.

        Raises:
            WorkerError: no item arrived for ``CHANNEL_TIMEOUT_S`` (the env workers stopped).
        """
        self._sync(weights)
        busy, link, key = 0.0, self.link, str(self.rank)
        pending = link.ahead(obs_channel, key) if num_items else None
        for i in range(num_items):
            msg = link.receive(pending, "observations")
            if i + 1 < num_items:  # fetch the next item while this one infers
                pending = link.ahead(obs_channel, key)
            started = time.perf_counter()
            with trace.span("generate", "rollout", self.device_labels):
                answer = self.infer(msg, epoch)
                sim = self.run.simulate
                wait = latency_s(
                    self.rng, len(msg.obs), sim.env_policy_latency_ms, sim.env_policy_jitter_ms
                )
                left = wait - (time.perf_counter() - started)
                if left > 0:
                    time.sleep(left)  # modelled device time of the policy
            busy += time.perf_counter() - started
            link.send(act_channel, answer, f"{msg.env_rank}/{msg.stage}")
        link.flush()
        return {"items": float(num_items), "infer_s": busy}

    def infer(self, msg: ObsMessage, epoch: int) -> ActionMessage:
        """Sample actions for one item (seeded by the item, see :func:`item_seed`)."""
        gen = torch.Generator().manual_seed(
            item_seed(self.run.seed, epoch, msg.env_rank, msg.stage, msg.step)
        )
        obs = torch.tensor(msg.obs, device=self.device)  # object-store arrays are read-only
        actions, logprobs = self.model.act(obs, gen)
        return ActionMessage(actions.cpu().numpy(), logprobs.cpu().numpy(), self.version)

    def evaluate(self, weights: HostBuckets | None, episodes: int, seed: int) -> dict[str, float]:
        """Greedy episodes on fresh environments of this process.

        Args:
            weights: the weights to evaluate.
            episodes: episodes to run (one sub-environment each, all at once).
            seed: seeds the environments (sub-environment ``i`` gets ``seed + i``).

        Returns:
            ``{"return_mean", "return_min", "length_mean"}`` over the episodes.
        """
        self._sync(weights)
        with trace.span("evaluate", "rollout", self.device_labels):
            returns, lengths = greedy_episodes(self.model, self.spec, episodes, seed, self.device)
        return {
            "return_mean": float(np.mean(returns)),
            "return_min": float(np.min(returns)),
            "length_mean": float(np.mean(lengths)),
        }


def greedy_episodes(
    model: ActorCritic, spec: SpaceSpec, episodes: int, seed: int, device: torch.device
) -> tuple[list[float], list[int]]:
    """Run one greedy episode in each of ``episodes`` sub-environments; returns and lengths."""
    env = make_vector_env(spec.env_id, episodes)
    try:
        obs = env.reset(seed=seed)[0]
        total = np.zeros(episodes)
        length = np.zeros(episodes, dtype=np.int64)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            actions, _ = model.act(torch.from_numpy(obs.astype(np.float32)).to(device), None, True)
            actions = actions.cpu().numpy()
            if spec.action_kind == "continuous":
                actions = np.clip(actions, spec.low, spec.high)
            obs, reward, term, trunc, _ = env.step(actions)
            total += reward * running
            length += running
            # A finished sub-environment resets and runs on; only its first episode counts.
            running &= ~np.logical_or(term, trunc)
    finally:
        env.close()
    return total.tolist(), length.tolist()


class EmbodiedActorWorker(Worker, ResidentState):
    """One data-parallel rank of the PPO actor-critic.

    Args:
        run: the checked run config.
        spec: the environment's spaces.
    """

    def __init__(self, run: RunConfig, spec: SpaceSpec) -> None:
        seed_everything(run.seed)
        self.run, self.spec = run, spec
        self.settings = PPOSettings.from_config(run)
        self.device = compute_device(self)
        self.model = build_policy(run, spec).to(self.device)
        o = run.optimizer
        # AdamW with the optimizer.* settings (weight_decay included; with weight_decay=0 it
        # takes exactly Adam's steps).
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=o.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
        )
        self.optim_steps = 0  # optimizer steps taken: the warmup's clock
        self.mover = StateMover(self.model, self.optimizer, device=self.device)
        self.ddp: nn.Module | None = None

    def setup_data_parallel(self) -> None:
        """Wrap the model for gradient all-reduce (after the group's process group exists)."""
        if self.world_size > 1:
            from rltrain.backends.host_allreduce import wrap_data_parallel

            c = self.run.cluster
            self.ddp = wrap_data_parallel(
                self.model, self.device, c.collective_timeout_s, host_allreduce=c.host_allreduce
            )

    def train(self, rollout_refs: list[Any], iteration: int) -> TrainResult:
        """One PPO update on every env process's epoch (this rank trains its share of rows).

        Args:
            rollout_refs: object refs of the env processes' :class:`EnvRollout` (rank order),
                fetched here, not by the driver.
            iteration: the policy-update index (seeds minibatch shuffling alike on all ranks).

        Returns:
            Loss metrics (``loss/*``) with ``actor/grad_norm`` and ``actor/lr``, and the state
            sizes for the residency ledger.
        """
        import ray

        with trace.span("train", "actor", self.device_labels):
            rollouts = ray.get(list(rollout_refs))
            s = self.settings
            batch = build_transitions(self.model, rollouts, s.gamma, s.lam, self.device)
            gen = torch.Generator().manual_seed(seeds.minibatch_seed(self.run.seed, iteration))
            first_lr = self.lr_at(iteration, self.optim_steps)

            def before_step() -> None:
                self._set_lr(self.lr_at(iteration, self.optim_steps))
                self.optim_steps += 1

            metrics = ppo_epochs(
                self.ddp or self.model,
                self.optimizer,
                batch,
                s,
                gen,
                self.rank,
                self.world_size,
                before_step,
            )
            # section/name keys, as the reasoning actor logs them
            metrics["actor/grad_norm"] = metrics.pop("grad_norm")
            metrics["actor/lr"] = first_lr
        if self.run.simulate.actor_latency_ms:  # a slower device (simulate.*)
            time.sleep(self.run.simulate.actor_latency_ms / 1000)
        return TrainResult(metrics, self.state_bytes())

    def lr_at(self, iteration: int, optim_step: int) -> float:
        """The learning rate of an optimizer step: ``optimizer.lr x (1 - (1 - f) x iteration /
        trainer.total_steps)`` with ``f = env.lr_final_fraction`` (so the last update, iteration
        ``total_steps - 1``, trains at ``optimizer.lr x (f + (1 - f) / total_steps)``; ``f`` is
        where the line would be one update later), times the linear warmup over the first
        ``optimizer.warmup_steps`` optimizer steps.

        Args:
            iteration: the policy-update index (0-based).
            optim_step: optimizer steps taken before this one (the warmup's clock).

        Returns:
            The learning rate.
        """
        from rltrain.backends.training import warmup_factor

        frac = self.run.env.lr_final_fraction
        progress = min(iteration / max(self.run.trainer.total_steps, 1), 1.0)
        decay = 1.0 - (1.0 - frac) * progress
        warm = warmup_factor(optim_step, self.run.optimizer.warmup_steps)
        return self.run.optimizer.lr * decay * warm

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def export_weights(self, version: int, receiver: str = "rollout") -> HostBuckets:
        """Pack the current weights into host buckets for the rollout workers (the one
        ``receiver`` an embodied run has)."""
        with trace.span("sync", "actor", self.device_labels):
            return pack_to_host(list(self.model.named_parameters()), version=version)

    def save(self, path: str) -> None:
        """Write the model and optimizer state into ``path`` (rank 0), as the actor writes its
        own (:class:`~rltrain.workers.common.local_dir`: a remote URI is uploaded, a full disk is
        a ResourceError naming the directory)."""
        if self.rank != 0:
            return
        with local_dir(path) as local:
            torch.save(self.model.state_dict(), os.path.join(local, "policy.pt"))
            torch.save(self.optimizer.state_dict(), os.path.join(local, "optimizer.pt"))

    def load(self, path: str) -> None:
        """Restore model and optimizer written by :meth:`save`."""
        with fetched_dir(path) as local:
            state = torch.load(os.path.join(local, "policy.pt"), map_location=self.device)
            opt = torch.load(os.path.join(local, "optimizer.pt"), map_location=self.device)
        self.model.load_state_dict(state)
        self.optimizer.load_state_dict(opt)
        from rltrain.backends.training import optimizer_steps

        self.optim_steps = optimizer_steps(self.optimizer)
