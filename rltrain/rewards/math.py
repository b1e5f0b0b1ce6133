"""Rule rewards for math word problems: extract the final answer, compare it as a number.

Two answer conventions:

- **GSM8K** (``gsm8k``): the final answer follows ``####`` (``... so she has 18 apples.
  #### 18``). The number right after the *last* ``####`` followed by one counts (only
  spaces, a sign or ``$`` in between).
- **boxed** (``boxed``, MATH-style): the final answer is the argument of the *last*
  ``\\boxed{...}`` (nested braces allowed: ``\\boxed{\\frac{1}{2}}``); ``\\boxed 5`` (a number
  after a space) and ``\\fbox{...}`` are read too; a bare ``\\boxed`` in prose is no answer.

The reference answer (``task.answer_key``) may be the bare answer (``72``) or a whole reference
solution in the same convention (GSM8K's ``answer`` field, ``"... #### 72"``; MATH's ``solution``
with its ``\\boxed{}``): it is extracted the same way when it holds the marker.

Comparison: both sides are normalised (thousands commas, ``$``, ``%``, LaTeX spacing and
``\\left``/``\\right``, ``\\text{}``, a trailing full stop) and, when both read as numbers
(integers, decimals, ``a/b`` or ``\\frac{a}{b}``, negative too), compared exactly as
fractions, so ``18.0`` equals ``18``, ``0.5`` equals ``\\frac{1}{2}`` and 30-digit answers
compare without float rounding. Otherwise the normalised strings must be equal.

``*_with_format`` pays :data:`FORMAT_SCORE` for an answer that was extracted but is wrong, so a
policy learns the format before it learns to be right; greedy evaluation counts only full
rewards (>= 1) as correct, so accuracy is unaffected by the format bonus.
"""

from __future__ import annotations

import re
from fractions import Fraction

#: What ``*_with_format`` pays for a well-formed but wrong final answer.
FORMAT_SCORE = 0.1

# "####" then, optionally, a number as written in a solution, on the marker's line: sign (the
# Unicode minus too, as normalize_answer reads it) and dollar (spaces between), digits with
# thousands commas (a comma only between digits: "42, since" is 42), decimals, an optional "/d"
# denominator. Linear-time: each repetition starts with a comma, so no two ways to match overlap.
_HASH_NUMBER = re.compile(
    r"####[ \t]*([-+\u2212]?[ \t]*\$?[ \t]*[-+\u2212]?"
    r"(?:\d+(?:,\d+)*(?:\.\d+)?|\.\d+)(?:[ \t]*/[ \t]*\d+)?)?"
)
_BOX = re.compile(r"\\(?:boxed|fbox)")
_BOX_ARG = re.compile(r"\s*(\{)|\s+(\S+)")  # a brace group, or one word after a space
_FRAC = re.compile(r"^([-+]?)\\frac\{([^{}]*)\}\{([^{}]*)\}$")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def extract_hash_answer(text: str) -> str | None:
    """The final answer of a GSM8K-style solution: the number right after the last ``####``
    that has one.

    Spaces, a sign (the Unicode minus too) and a ``$`` may come between the marker and the
    digits (``#### -$5``); any other text may not (``#### the answer is 5`` holds no answer),
    as in GSM8K's own solutions.

    Args:
        text: a response or a reference solution.

    Returns:
        The number as written (``"1,200"``), or None when no ``####`` is followed by a number.
    """
    for found in reversed(list(_HASH_NUMBER.finditer(text))):
        if found.group(1) is not None:
            return found.group(1).strip()
    return None


def extract_boxed(text: str) -> str | None:
    """The argument of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``).

    Braces nest: ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. Without braces only a
    number after a space is an argument (``\\boxed 5``); a bare ``\\boxed`` in prose ("I put
    it in \\boxed as asked") holds no answer, so the box before it counts.

    Args:
        text: a response or a reference solution.

    Returns:
        The boxed text, or None when there is no box, the last box is empty, or it is never
        closed (a response cut off by the token budget has no final answer).
    """
    for found in reversed(list(_BOX.finditer(text))):
        arg = _BOX_ARG.match(text, found.end())
        if arg is None:
            continue
        if arg.group(1) is not None:
            return _braced(text, arg.start(1))
        word = arg.group(2).rstrip("$")
        if parse_number(word) is not None:
            return word
    return None


def _braced(text: str, start: int) -> str | None:
    """The inside of the brace group opening at ``text[start]``; None when empty or never
    closed."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i].strip() or None  # an empty box holds no answer
    return None


def normalize_answer(text: str) -> str:
    """A final answer in a canonical spelling, for comparison.

    Removes spaces, ``$``, ``%``, LaTeX spacing (``\\,`` ``\\!`` ``\\;``), ``\\left`` /
    ``\\right``, degree signs (``^\\circ`` and ``°``), a trailing full stop; unwraps
    ``\\text{...}``; maps ``\\dfrac`` and ``\\tfrac`` to ``\\frac`` and the Unicode minus to
    ``-``.

    Args:
        text: an extracted answer.

    Returns:
        The normalised text.
    """
    s = _TEXT.sub(r"\1", text)
    for old, new in (
        ("\u2212", "-"),
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\ ", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\u00b0", ""),  # the Unicode degree sign, as LaTeX's
        ("\\$", ""),
        ("$", ""),
        ("\\%", ""),
        ("%", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
    ):
        s = s.replace(old, new)
    s = "".join(s.split())
    return s.rstrip(".")


def parse_number(text: str) -> Fraction | None:
    """Read an answer as an exact number.

    Accepts integers, decimals, thousands commas (``1,234.5``), ``a/b``, ``\\frac{a}{b}``,
    signs, ``$`` and ``%`` (dropped), after :func:`normalize_answer`.

    Args:
        text: an extracted answer.

    Returns:
        The value, or None when it is not a number (``x+1``, ``1,2``, a number with more digits
        than Python converts, a zero denominator).
    """
    s = normalize_answer(text)
    frac = _FRAC.match(s)
    if frac is not None:
        sign, num, den = frac.groups()
        a, b = parse_number(num), parse_number(den)
        if a is None or b is None or b == 0:
            return None
        return -a / b if sign == "-" else a / b
    if "," in s:
        if not _THOUSANDS.fullmatch(s):
            return None
        s = s.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):  # over Python's int digit limit; "1/0"
        return None


def answers_equal(got: str, want: str) -> bool:
    """Whether two extracted answers agree: as exact numbers when both are, else as text.

    Args:
        got: the response's final answer.
        want: the reference answer.

    Returns:
        True when equal.
    """
    a, b = parse_number(got), parse_number(want)
    if a is not None and b is not None:
        return a == b
    return normalize_answer(got) == normalize_answer(want)


_EXTRACT = {"gsm8k": extract_hash_answer, "boxed": extract_boxed}


def math_reward(response: str, answer: str, style: str, format_score: float = 0.0) -> float:
    """Score a response's final answer against the reference.

    Args:
        response: the generated text.
        answer: the reference: the bare answer or a whole solution in the same convention.
        style: ``"gsm8k"`` (``####``) or ``"boxed"`` (``\\boxed{}``).
        format_score: paid when the response has a final answer that is wrong.

    Returns:
        1.0 for a correct final answer, ``format_score`` for a wrong one, 0.0 for none.

    Raises:
        ValueError: an unknown style.
    """
    if style not in _EXTRACT:
        raise ValueError(f"style={style!r}: choose one of {sorted(_EXTRACT)}")
    extract = _EXTRACT[style]
    got = extract(response)
    if got is None:
        return 0.0
    want = extract(answer) or answer  # a whole reference solution, or the bare answer
    return 1.0 if answers_equal(got, want.strip()) else format_score


def full_reward_response(answer: str, style: str) -> str:
    """A response that earns the full reward against ``answer``: the final answer the reward
    reads from the reference, written in the convention (``#### 7``, ``\\boxed{7}``).

    Only this text has to be spellable by the tokenizer: a reference solution's prose never
    has to be generated. A number is written plainly (``1,200`` as ``1200``: the reward
    compares values), anything else in its normalised spelling.

    Args:
        answer: the reference: the bare answer or a whole solution in the same convention.
        style: ``"gsm8k"`` or ``"boxed"``.

    Returns:
        The response text.

    Raises:
        ValueError: an unknown style.
    """
    if style not in _EXTRACT:
        raise ValueError(f"style={style!r}: choose one of {sorted(_EXTRACT)}")
    want = (_EXTRACT[style](answer) or answer).strip()
    value = parse_number(want)
    text = str(value.numerator) if value is not None and value.denominator == 1 else None
    text = text or normalize_answer(want)
    return f"#### {text}" if style == "gsm8k" else f"\\boxed{{{text}}}"


def gsm8k(prompt: str, response: str, answer: str) -> float:
    """1.0 when the number after the response's last ``####`` equals the reference, else 0.0.

    Args:
        prompt: unused (part of the reward signature).
        response: the generated text.
        answer: the reference answer, bare (``72``) or a GSM8K solution ending ``#### 72``.
    """
    del prompt
    return math_reward(response, answer, "gsm8k")


def gsm8k_with_format(prompt: str, response: str, answer: str) -> float:
    """:func:`gsm8k`, plus :data:`FORMAT_SCORE` for a ``#### <number>`` answer that is wrong."""
    del prompt
    return math_reward(response, answer, "gsm8k", FORMAT_SCORE)


def boxed(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response's last ``\\boxed{}`` equals the reference, else 0.0.

    Args:
        prompt: unused (part of the reward signature).
        response: the generated text.
        answer: the reference answer, bare (``\\frac{1}{2}``) or a solution with a
            ``\\boxed{}``.
    """
    del prompt
    return math_reward(response, answer, "boxed")


def boxed_with_format(prompt: str, response: str, answer: str) -> float:
    """:func:`boxed`, plus :data:`FORMAT_SCORE` for a boxed answer that is wrong."""
    del prompt
    return math_reward(response, answer, "boxed", FORMAT_SCORE)


# What a response must spell to earn each reward (read by the task's spelling check,
# :func:`rltrain.tasks.build.assemble`): the final answer, not the reference solution's prose.
gsm8k.full_reward_response = lambda answer: full_reward_response(answer, "gsm8k")
gsm8k_with_format.full_reward_response = gsm8k.full_reward_response
boxed.full_reward_response = lambda answer: full_reward_response(answer, "boxed")
boxed_with_format.full_reward_response = boxed.full_reward_response
