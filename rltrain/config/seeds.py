"""Every seed rltrain derives from the run's ``seed`` (and ``task.seed``), in one place.

A derived seed must be a valid seed for whatever takes it: NumPy's ``np.random.seed`` (and vLLM's
engine, which calls it) refuses anything outside ``[0, 2**32)``. Validation accepts any ``seed``
in that range, so each derivation here wraps into it: ``value % 2**32``, or, where the consumer
adds up to ``k`` itself (a vector environment seeds its sub-environment ``i`` with
``seed + i``), ``value % (2**32 - k)`` so that ``seed + i`` stays inside too. The formulas are the
ones rltrain always used; wrapping leaves every value that was already in range unchanged, so
runs with small seeds sample, shuffle and reset exactly as before.

``tests/unit/config/test_seeds.py`` checks every function of :data:`DERIVATIONS` over the whole
accepted range with Hypothesis, and that no module derives a seed outside this file.
"""

from __future__ import annotations

from collections.abc import Callable

#: Seeds are 32-bit: ``[0, SEED_SPACE)``.
SEED_SPACE = 2**32

#: Evaluation environments' seeds start this far from the training environments'.
EVAL_OFFSET = 1_000_000


def _wrap(value: int, room: int = 0) -> int:
    """``value`` folded into ``[0, SEED_SPACE - room)``, so that a consumer adding any
    ``i < room`` to it still gets a seed below ``SEED_SPACE``."""
    return value % (SEED_SPACE - room)


def engine_seed(seed: int, rank: int) -> int:
    """The vLLM engine's global seed of rollout rank ``rank`` (vLLM passes it to
    ``np.random.seed``)."""
    return _wrap(seed * 1_000_003 + rank)


def sampling_seed(seed: int, step: int, rank: int) -> int:
    """Rollout rank ``rank``'s sampling seed at ``step`` (the torch sampler's generator and
    vLLM's per-request seed): a resumed run and a fused rank standing in for the rank sample
    the same."""
    return _wrap(seed * 1_000_003 + step * 1_009 + rank)


def continuation_seed(seed: int, step: int, rank: int, version: int) -> int:
    """The sampling seed of a paused generation's continuation with weight ``version``
    (``trainer.partial_rollout=continue``): apart from the first pass's and from every other
    step's, and the same in a resumed run."""
    return _wrap((seed * 1_000_003 + step * 1_009 + rank) * 7_919 + version + 1)


def segment_seed(seed: int, step: int, rank: int, part: int) -> int:
    """The sampling seed of the ``part``-th decoding segment of a ``trainer.partial_rollout=carry``
    call for ``step`` on the torch engine: apart from every other segment, step and rank."""
    return _wrap(((seed * 1_000_003 + step * 1_009 + rank) * 7_919 + 2**17) * 1_031 + part)


def minibatch_seed(seed: int, step: int) -> int:
    """The actor's minibatch shuffling at update ``step`` (the embodied actor's at iteration
    ``step``)."""
    return _wrap(seed * 1_000_003 + step)


def critic_minibatch_seed(seed: int, step: int) -> int:
    """The critic's minibatch shuffling at ``step`` (apart from the actor's)."""
    return _wrap(seed * 1_000_003 + step + 7919)


def epoch_order_seed(task_seed: int, epoch: int) -> int:
    """The permutation of the training prompts in ``epoch`` (``task.seed``)."""
    return _wrap(task_seed * 1_000_003 + epoch)


def dataset_seed(task_seed: int, version: int) -> int:
    """A generated dataset's problems and order (``gsm8k_tiny``'s generator ``version``)."""
    return _wrap(task_seed * 7919 + version)


def item_seed(seed: int, epoch: int, env_rank: int, stage: int, step: int) -> int:
    """The embodied policy's sampling of one observation item (independent of the rollout rank
    that serves it)."""
    return _wrap((((seed * 1_000_003 + epoch) * 1_009 + env_rank) * 131 + stage) * 100_003 + step)


def policy_rng_seed(seed: int, rank: int) -> int:
    """The embodied rollout rank's NumPy generator."""
    return _wrap(seed * 6_151 + rank)


def env_rng_seed(seed: int, rank: int) -> int:
    """The env rank's NumPy generator."""
    return _wrap(seed * 7_919 + rank)


def env_stage_seed(seed: int, rank: int, num_stages: int, envs_per_stage: int, stage: int) -> int:
    """The reset seed of one pipeline stage's vector environment; its sub-environment ``i``
    resets with ``result + i`` (``i < envs_per_stage``)."""
    value = seed * 100_003 + (rank * num_stages + stage) * envs_per_stage
    return _wrap(value, envs_per_stage)


def eval_episode_seed(seed: int, step: int, episodes: int) -> int:
    """The reset seed of the greedy evaluation at ``step``; episode ``i`` resets with
    ``result + i`` (``i < episodes``)."""
    return _wrap(seed * 7_777 + EVAL_OFFSET + step, episodes)


def episode_turn_seed(seed: int, row: int, turn: int) -> int:
    """The sampling seed of turn ``turn`` of episode ``row`` of a multi-turn batch: ``seed`` is
    the call's sampling seed. Per episode and turn, so what a turn samples never depends on the
    rows it shared a decoding batch with, or on when its tool answered."""
    return _wrap(seed * 1_000_003 + row * 7_919 + turn)


def tool_failure_seed(seed: int, row: int, call: int) -> int:
    """The draw of ``simulate.tool_failure_rate`` for call ``call`` of episode ``row``:
    ``seed`` is the generation call's sampling seed (per step and rank), or an evaluation's
    own, so each step, rank and evaluation draws its own failures."""
    return _wrap(seed * 1_000_003 + row * 1_009 + call)


#: Bits of a prompt's index in :func:`prompt_seed` (prompts per generate call and rank).
PROMPT_BITS = 16


def _mix(value: int, bits: int) -> int:
    """A bijection of ``[0, 2**bits)`` that spreads neighbouring values apart (odd multipliers
    and xor-shifts are each invertible modulo ``2**bits``)."""
    mask = (1 << bits) - 1
    value = (value * 0x9E3779B1) & mask
    value ^= value >> max(1, bits // 2)
    return (value * 0x85EBCA6B) & mask


def prompt_seed(seed: int, prompt: int, n: int) -> int:
    """vLLM's seed for prompt ``prompt`` (its index in the call) of a generate call whose
    sampling seed is ``seed`` (:func:`sampling_seed`, :func:`continuation_seed`); vLLM seeds the
    prompt's sample ``i`` with ``result + i`` (``i < n``).

    vLLM's sampler draws a request's noise from its seed and position alone, so one seed for
    every prompt of a call would give equal-length prompts the same noise, and the next rank's
    seeds (``seed + 1``) would repeat this one's. Here the low ``b = (n - 1).bit_length()`` bits
    hold the sample, and the bits above them a bijective mix of ``seed * 2**16 + prompt``
    modulo ``2**(32 - b)``. So no two samples of one step share a seed as long as the prompts
    of a call number at most ``2**16`` and the calls' seeds differ modulo ``2**(16 - b)``: the
    ranks of a step, up to ``2**(16 - b)`` of them (their sampling seeds are consecutive, their
    continuation seeds ``7919`` apart). The same seed, prompt and ``n`` always give the same
    result (a resumed run, a fused rank standing in for the rank).
    """
    low = max(0, n - 1).bit_length()
    high = 32 - low
    return _mix(((seed << PROMPT_BITS) + prompt) % (1 << high), high) << low


#: Every derivation, by name, with the room its consumer adds (the name of the argument holding
#: it, or None): what the property test walks.
DERIVATIONS: dict[str, tuple[Callable[..., int], str | None]] = {
    "engine_seed": (engine_seed, None),
    "sampling_seed": (sampling_seed, None),
    "continuation_seed": (continuation_seed, None),
    "segment_seed": (segment_seed, None),
    "minibatch_seed": (minibatch_seed, None),
    "critic_minibatch_seed": (critic_minibatch_seed, None),
    "epoch_order_seed": (epoch_order_seed, None),
    "dataset_seed": (dataset_seed, None),
    "item_seed": (item_seed, None),
    "policy_rng_seed": (policy_rng_seed, None),
    "env_rng_seed": (env_rng_seed, None),
    "env_stage_seed": (env_stage_seed, "envs_per_stage"),
    "eval_episode_seed": (eval_episode_seed, "episodes"),
    "episode_turn_seed": (episode_turn_seed, None),
    "tool_failure_seed": (tool_failure_seed, None),
    "prompt_seed": (prompt_seed, "n"),
}
