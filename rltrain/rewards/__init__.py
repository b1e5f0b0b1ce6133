"""Named rule rewards a run can pick with ``task.reward_fn=rltrain.rewards.<module>:<function>``.

Every reward here has the task reward signature ``fn(prompt, response, answer) -> float``
(:data:`rltrain.tasks.base.RewardFn`): ``response`` is the generated text up to its
end-of-sequence token, ``answer`` the dataset row's reference (``task.answer_key``).

- :mod:`rltrain.rewards.math`: final-answer extraction and numeric comparison for math word
  problems: ``gsm8k`` (``#### 42``), ``boxed`` (``\\boxed{42}``), and their ``*_with_format``
  variants that also pay a small reward for a well-formed but wrong answer.
"""

from rltrain.rewards.math import (
    FORMAT_SCORE,
    boxed,
    boxed_with_format,
    extract_boxed,
    extract_hash_answer,
    gsm8k,
    gsm8k_with_format,
    math_reward,
    normalize_answer,
    parse_number,
)

__all__ = [
    "FORMAT_SCORE",
    "boxed",
    "boxed_with_format",
    "extract_boxed",
    "extract_hash_answer",
    "gsm8k",
    "gsm8k_with_format",
    "math_reward",
    "normalize_answer",
    "parse_number",
]
