"""Batch sizes derived once, before anything starts, into a frozen record.

Config values never change meaning after load (no ``mini_batch *= n; //= world``): every size a
worker or the driver loop uses is computed here from the config and the plan's world sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError

#: A micro-batch size left null that nothing has chosen yet counts as this many rows, in the
#: plan and in the batch sizes (a plan built straight from a config; a run chooses its sizes
#: first: rltrain.placement.micro_batches).
UNCHOSEN_MICRO_BATCH = 64


@dataclass(frozen=True)
class BatchSizes:
    """Sizes of one training step of the reasoning runner.

    Attributes:
        prompts_per_step: prompts drawn per step (``trainer.train_batch_size``).
        samples_per_prompt: responses sampled per prompt (``rollout.n_samples_per_prompt``).
        samples_per_step: prompts x samples.
        rollout_dp: rollout data-parallel size (processes; each holds whole prompt groups).
        actor_dp: actor data-parallel size.
        prompts_per_rollout_rank: prompts each rollout process generates for.
        samples_per_actor_rank: samples each actor process trains on per step.
        minibatches: optimizer steps per epoch (``algorithm.num_minibatches``).
        samples_per_minibatch: samples per actor process per optimizer step.
        micro_batch: sequences per forward/backward (gradient accumulation below it).
    """

    prompts_per_step: int
    samples_per_prompt: int
    samples_per_step: int
    rollout_dp: int
    actor_dp: int
    prompts_per_rollout_rank: int
    samples_per_actor_rank: int
    minibatches: int
    samples_per_minibatch: int
    micro_batch: int


def derive_sizes(run: RunConfig, actor_world: int, rollout_world: int) -> BatchSizes:
    """Derive and check the step's batch sizes against the plan's world sizes.

    Args:
        run: the checked run config.
        actor_world: actor processes in the plan (data-parallel size x tensor-parallel size).
        rollout_world: rollout processes in the plan.

    Returns:
        The frozen sizes.

    Raises:
        ConfigError: naming the keys whose values do not divide, and values that would.
    """
    prompts = run.trainer.train_batch_size
    n = run.rollout.n_samples_per_prompt
    actor_dp = max(1, actor_world // run.actor.tensor_parallel_size)
    rollout_dp = max(1, rollout_world)
    samples = prompts * n
    problems = []
    if prompts % rollout_dp:
        problems.append(
            f"trainer.train_batch_size={prompts} does not divide by the rollout's data-parallel "
            f"size {rollout_dp} (its processes in placement.component_placement): use a multiple "
            f"of {rollout_dp}, e.g. {_next_multiple(prompts, rollout_dp)}"
        )
    mb = run.algorithm.num_minibatches
    if samples % (actor_dp * mb):
        problems.append(
            f"trainer.train_batch_size x rollout.n_samples_per_prompt = {samples} samples do not "
            f"divide by the actor's data-parallel size {actor_dp} x algorithm.num_minibatches "
            f"{mb}: use a train_batch_size that makes samples a multiple of {actor_dp * mb}"
        )
    if problems:
        raise ConfigError(problems)
    per_actor = samples // actor_dp
    return BatchSizes(
        prompts_per_step=prompts,
        samples_per_prompt=n,
        samples_per_step=samples,
        rollout_dp=rollout_dp,
        actor_dp=actor_dp,
        prompts_per_rollout_rank=prompts // rollout_dp,
        samples_per_actor_rank=per_actor,
        minibatches=mb,
        samples_per_minibatch=per_actor // mb,
        micro_batch=min(run.actor.micro_batch_size or UNCHOSEN_MICRO_BATCH, per_actor // mb),
    )


def _next_multiple(x: int, k: int) -> int:
    return (x + k - 1) // k * k


@dataclass(frozen=True)
class CriticSizes:
    """Rows of one step as the critic group splits them.

    Attributes:
        dp: critic processes (data-parallel size).
        samples_per_rank: rows each critic process trains on per step.
        samples_per_minibatch: rows per optimizer step on one process.
        micro_batch: rows per forward/backward (``critic.micro_batch_size``, at most a minibatch).
    """

    dp: int
    samples_per_rank: int
    samples_per_minibatch: int
    micro_batch: int


def derive_critic_sizes(run: RunConfig, samples_per_step: int, critic_world: int) -> CriticSizes:
    """Split a step's samples over the critic's processes and minibatches.

    Args:
        run: the checked run config.
        samples_per_step: ``trainer.train_batch_size x rollout.n_samples_per_prompt``.
        critic_world: critic processes in the plan.

    Returns:
        The frozen sizes.

    Raises:
        ConfigError: the samples do not divide by processes x minibatches, or
            ``critic.micro_batch_size`` is not positive.
    """
    dp, mb = max(critic_world, 1), run.algorithm.num_minibatches
    if run.critic.micro_batch_size is not None and run.critic.micro_batch_size <= 0:
        raise ConfigError(
            f"critic.micro_batch_size={run.critic.micro_batch_size} must be positive (rows per "
            f"forward/backward of the critic)"
        )
    if samples_per_step % (dp * mb):
        raise ConfigError(
            f"trainer.train_batch_size x rollout.n_samples_per_prompt = {samples_per_step} "
            f"samples do not divide by the critic's data-parallel size {dp} (its processes in "
            f"placement.component_placement.critic) x algorithm.num_minibatches {mb}: use a "
            f"train_batch_size that makes samples a multiple of {dp * mb}, or place the critic "
            f"on fewer devices"
        )
    per_rank = samples_per_step // dp
    return CriticSizes(
        dp=dp,
        samples_per_rank=per_rank,
        samples_per_minibatch=per_rank // mb,
        micro_batch=min(run.critic.micro_batch_size or UNCHOSEN_MICRO_BATCH, per_rank // mb),
    )
