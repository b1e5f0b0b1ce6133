"""The task record every reasoning task produces: prompts, answers, a reward, a data order.

A task is plain data plus a reward function; it holds no model and no Ray handle, so the driver
and every worker can build the same task from the same config and agree on what step ``k``
trains on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rltrain.config.seeds import epoch_order_seed
from rltrain.errors import ConfigError, import_user_module

#: ``reward_fn(prompt, response, answer) -> float``; ``response`` is the decoded text the model
#: generated after the prompt, up to (not including) its end-of-sequence token.
RewardFn = Callable[[str, str, str], float]


@dataclass(frozen=True)
class Example:
    """One prompt and the answer its reward is checked against."""

    prompt: str
    answer: str


def exact_match(prompt: str, response: str, answer: str) -> float:
    """The default rule-based reward: 1.0 when the response, stripped, equals the answer.

    Args:
        prompt: the prompt text (unused; part of the reward signature).
        response: the generated text after the prompt, without the end-of-sequence token.
        answer: the reference answer.

    Returns:
        1.0 for an exact match after stripping surrounding whitespace, else 0.0.
    """
    del prompt
    return 1.0 if response.strip() == answer.strip() else 0.0


def import_reward_fn(spec: str, key: str = "task.reward_fn") -> RewardFn:
    """Import a reward function named ``"package.module:function"``.

    Args:
        spec: the dotted module path and attribute, separated by a colon.
        key: the config key the spec came from, for the error message.

    Returns:
        The callable.

    Raises:
        ConfigError: the spec is malformed, the module cannot be imported, the attribute is
            missing, or it is not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{key}={spec!r} must look like 'package.module:function'")
    try:
        module = import_user_module(key, spec, module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{key}={spec!r}: cannot import module {module_name!r} ({exc}); make it importable "
            f"(installed, or on PYTHONPATH) or fix the name"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError(
            f"{key}={spec!r}: module {module_name!r} has no callable {attr!r}; "
            f"define def {attr}(prompt, response, answer) -> float there"
        )
    return fn


@dataclass(frozen=True)
class Task:
    """Training and evaluation prompts with their reward.

    The data order is a pure function of ``(seed, step, batch_size)``: the training prompts are
    walked epoch by epoch, each epoch in its own seeded permutation. So a run resumed at step
    ``k`` sees exactly the prompts an uninterrupted run would, with no cursor to save.

    Attributes:
        name: the task's name (``task.name``).
        train: the training examples.
        eval: the examples greedy evaluation scores.
        eval_is_train: True when ``eval`` is the training set itself (nothing held out).
        seed: seeds the data order.
        reward_fn: scores one response; see :data:`RewardFn`.
        aliases: other spellings of prompts -> the prompt: a prompt decoded from its token ids
            without special tokens (what the reward worker reads back) differs from the
            rendered chat-template text the task holds.
    """

    name: str
    train: tuple[Example, ...]
    eval: tuple[Example, ...]
    eval_is_train: bool
    seed: int
    reward_fn: RewardFn = exact_match
    aliases: dict[str, str] = field(default_factory=dict, repr=False, hash=False)
    _answers: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.train:
            raise ConfigError(f"task {self.name!r} has no training prompts: check task.num_eval")
        answers: dict[str, str] = {}
        for ex in (*self.train, *self.eval):
            answers.setdefault(ex.prompt, ex.answer)
        object.__setattr__(self, "_answers", answers)  # a frozen record's derived lookup

    def sample_batch(self, step: int, batch_size: int) -> list[Example]:
        """Return the training examples of one step.

        Args:
            step: the 0-based policy-update index.
            batch_size: prompts per step.

        Returns:
            ``batch_size`` examples; deterministic in ``(seed, step, batch_size)``.
        """
        n = len(self.train)
        out = []
        for pos in range(step * batch_size, (step + 1) * batch_size):
            order = self._epoch_order(pos // n)
            out.append(self.train[order[pos % n]])
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.train)))
        random.Random(epoch_order_seed(self.seed, epoch)).shuffle(order)
        return order

    def canonical(self, prompt: str) -> str:
        """The task's own spelling of a prompt given as held or as an alias.

        Raises:
            KeyError: the prompt is not one of the task's prompts.
        """
        if prompt in self._answers:
            return prompt
        return self.aliases[prompt]

    def answer(self, prompt: str) -> str:
        """The reference answer of a prompt of this task (held or alias spelling).

        Raises:
            KeyError: the prompt is not one of the task's prompts.
        """
        return self._answers[self.canonical(prompt)]

    def reward(self, prompt: str, response: str) -> float:
        """Score a response to one of this task's prompts.

        Args:
            prompt: a prompt from ``train`` or ``eval``, or one of its :attr:`aliases`.
            response: the generated text after the prompt, without the end-of-sequence token.

        Returns:
            The reward, as a float (``reward_fn`` gets the prompt as the task holds it).

        Raises:
            KeyError: the prompt is not one of the task's prompts.
        """
        held = self.canonical(prompt)
        return float(self.reward_fn(held, response, self._answers[held]))


def _check_train_count(num_train: int, rest: int, total: int, num_eval: int, prefix: str) -> None:
    """Refuse asking for more training rows than the ``rest`` the held-out prompts leave."""
    if num_train > rest:
        out = f" ({total - rest} held out by {prefix}.num_eval)" if num_eval else ""
        raise ConfigError(
            f"{prefix}.num_train={num_train} is more than the {rest} training prompts the task "
            f"has ({total} prompts{out}): choose at most {rest}, or 0 for all of them"
        )


def split_eval(
    examples: Sequence[Example], num_eval: int, num_train: int, seed: int, key_prefix: str = "task"
) -> tuple[tuple[Example, ...], tuple[Example, ...], bool]:
    """Split examples into training and held-out evaluation sets.

    The split is by distinct prompt: a prompt given on several rows is held out on none of
    them or on all of them (evaluated once), so no held-out prompt is ever trained on.

    Args:
        examples: every example of the task, in a fixed order.
        num_eval: distinct prompts held out for evaluation; 0 evaluates on the training
            examples.
        num_train: training examples (rows) to keep; 0 keeps all that are not held out.
        seed: seeds the shuffle that picks the held-out prompts.
        key_prefix: config section named in errors.

    Returns:
        ``(train, eval, eval_is_train)``.

    Raises:
        ConfigError: the counts are negative, leave no training example, or ask for more
            training examples than there are (as ``num_eval`` may not hold out more than
            there are).
    """
    if num_eval < 0 or num_train < 0:
        raise ConfigError(
            f"{key_prefix}.num_eval={num_eval} / {key_prefix}.num_train={num_train}: "
            f"counts must be >= 0"
        )
    rows: dict[str, list[int]] = {}  # each distinct prompt -> its rows, in first-seen order
    for i, ex in enumerate(examples):
        rows.setdefault(ex.prompt, []).append(i)
    groups = list(rows.values())
    if num_eval >= len(groups):
        raise ConfigError(
            f"{key_prefix}.num_eval={num_eval} holds out every one of the task's "
            f"{len(groups)} distinct prompts: choose fewer than {len(groups)}"
        )
    order = list(range(len(groups)))
    random.Random(seed).shuffle(order)
    held = sorted(groups[g][0] for g in order[:num_eval])
    rest = [i for g in order[num_eval:] for i in groups[g]]
    _check_train_count(num_train, len(rest), len(examples), num_eval, key_prefix)
    kept = sorted(rest[:num_train] if num_train else rest)
    train = tuple(examples[i] for i in kept)
    if num_eval == 0:
        return train, train, True
    return train, tuple(examples[i] for i in held), False
