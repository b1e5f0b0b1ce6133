"""The built-in verifiable-reward task: sums ``a+b=`` of small non-negative integers.

Every prompt ``f"{a}+{b}="`` with ``0 <= a, b <= max_operand`` is generated (no download, no
randomness beyond the seeded split and data order); the answer is the decimal sum and the reward
is an exact match of the generated text (up to end-of-sequence) against it.
"""

from __future__ import annotations

from rltrain.errors import ConfigError
from rltrain.tasks.base import Example, RewardFn, Task, exact_match, split_eval


def arithmetic_examples(max_operand: int) -> list[Example]:
    """Every sum of two operands in ``0..max_operand``, in row-major order.

    Args:
        max_operand: the largest operand.

    Returns:
        ``(max_operand + 1) ** 2`` examples, e.g. ``Example("3+4=", "7")``.

    Raises:
        ConfigError: ``max_operand`` is negative.
    """
    if max_operand < 0:
        raise ConfigError(f"task.max_operand={max_operand} must be >= 0")
    r = range(max_operand + 1)
    return [Example(f"{a}+{b}=", str(a + b)) for a in r for b in r]


def build_arithmetic_task(
    seed: int,
    max_operand: int,
    num_eval: int = 0,
    num_train: int = 0,
    reward_fn: RewardFn = exact_match,
) -> Task:
    """Build the arithmetic task.

    Args:
        seed: seeds the held-out split and the data order.
        max_operand: operands range over ``0..max_operand``.
        num_eval: prompts held out for evaluation; 0 evaluates on the training prompts.
        num_train: training prompts to keep; 0 keeps all that are not held out.
        reward_fn: the reward; exact match by default.

    Returns:
        The task.

    Raises:
        ConfigError: a count is out of range.
    """
    train, evals, same = split_eval(arithmetic_examples(max_operand), num_eval, num_train, seed)
    return Task("arithmetic", train, evals, same, seed, reward_fn)
