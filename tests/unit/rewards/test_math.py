"""Math rule rewards: final-answer extraction, numeric normalisation, hand-written cases."""

from __future__ import annotations

from fractions import Fraction

import pytest

from rltrain.rewards import math as m
from rltrain.rewards.math import (
    FORMAT_SCORE,
    answers_equal,
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
from rltrain.tasks import import_reward_fn


@pytest.mark.parametrize(
    "text, want",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("####42", "42"),
        ("#### $1,200.", "$1,200"),
        ("#### -5 degrees", "-5"),
        ("#### The answer is 18", None),  # the number must follow the marker
        ("#### - $ 5", "- $ 5"),  # spaces, sign and dollar may come between
        ("#### 3\nthinking again\n#### 5", "5"),  # the last marker wins
        ("#### 5\n####", "5"),  # a trailing marker without a number is not an answer
        ("#### 3/4", "3/4"),
        ("no marker, just 42", None),
        ("#### \n42", None),  # the number must be on the marker's line
        ("#### 42, since 6*7", "42"),  # a comma only groups digits: the sentence's is not kept
        ("#### 1,200, done", "1,200"),
        ("", None),
    ],
)
def test_hash_answer_extraction(text, want):
    assert extract_hash_answer(text) == want


@pytest.mark.parametrize(
    "text, want",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{1} then \boxed{2} and finally \boxed{ 3 }", "3"),  # several: the last
        (r"$\boxed 7$", "7"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{2} then \boxed{3", None),  # the last box is cut off: no final answer
        (r"\boxed{}", None),
        (r"\boxed", None),
        # a bare \boxed in prose is no answer: the box before it counts
        (r"\boxed{5}. I put it in \boxed as asked.", "5"),
        (r"I put it in \boxed as asked.", None),
        (r"\boxed 5$ and \boxed.", "5"),
        ("no box", None),
    ],
)
def test_boxed_extraction(text, want):
    assert extract_boxed(text) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("42", Fraction(42)),
        ("42.0", Fraction(42)),
        ("42.", Fraction(42)),
        ("1,234", Fraction(1234)),
        ("$1,234.50", Fraction(246900, 200)),
        ("-7", Fraction(-7)),
        ("\u22127", Fraction(-7)),  # Unicode minus
        ("3/4", Fraction(3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"-\dfrac{1}{8}", Fraction(-1, 8)),
        ("50%", Fraction(50)),
        (r"\text{12}", Fraction(12)),
        ("123456789012345678901234567890", Fraction(123456789012345678901234567890)),
        ("1,2", None),  # not thousands grouping
        ("x+1", None),
        ("1/0", None),
        (r"\frac{1}{0}", None),
        ("9" * 5000, None),  # over Python's int digit limit: not a number, no crash
        ("", None),
    ],
)
def test_parse_number(text, want):
    assert parse_number(text) == want


def test_gsm8k_reward_cases():
    assert gsm8k("", "3 + 4 = 7\n#### 7", "7") == 1.0
    assert gsm8k("", "#### 7.00", "She has 7 now.\n#### 7") == 1.0  # reference is a solution
    assert gsm8k("", "#### 1200", "#### 1,200") == 1.0
    assert gsm8k("", "#### $1,200", "1200") == 1.0
    assert gsm8k("", "#### -3", "-3") == 1.0 and gsm8k("", "#### 3", "-3") == 0.0
    assert gsm8k("", "#### 0.5", "1/2") == 1.0
    assert gsm8k("", "7", "7") == 0.0  # no marker: no final answer
    assert gsm8k("", "#### 7 #### 8", "7") == 0.0  # the last marker counts
    huge = "98765432109876543210987654321"
    assert gsm8k("", f"#### {huge}", huge) == 1.0
    # floats would call these equal (both round to 1e29); exact fractions do not
    assert gsm8k("", f"#### {huge[:-1]}2", huge) == 0.0


def test_a_comma_after_the_final_answer_is_not_part_of_it():
    # extracted "42," / "1,200," read as no number, and were scored as wrong answers
    assert math_reward("#### 42, since 6*7", "42", "gsm8k", 0.1) == 1.0
    assert math_reward("#### 1,200, done", "1200", "gsm8k", 0.1) == 1.0
    assert math_reward("#### 1,200, done", "1201", "gsm8k", 0.1) == 0.1


def test_a_final_answer_with_the_unicode_minus_is_read():
    assert extract_hash_answer("so \u2212$5 each\n#### \u2212$5") == "\u2212$5"
    assert gsm8k("", "#### \u22125", "-5") == 1.0
    assert gsm8k("", "#### \u22125", "5") == 0.0  # the sign is read, not dropped
    assert gsm8k("", "#### -5", "#### \u22125") == 1.0  # the reference solution's too
    assert gsm8k_with_format("", "#### \u22124", "-5") == FORMAT_SCORE


def test_format_reward_is_paid_only_for_a_wrong_but_well_formed_answer():
    assert gsm8k_with_format("", "#### 8", "7") == FORMAT_SCORE
    assert gsm8k_with_format("", "#### 7", "7") == 1.0
    assert gsm8k_with_format("", "the answer is 7", "7") == 0.0
    assert boxed_with_format("", r"\boxed{8}", "7") == FORMAT_SCORE
    assert boxed_with_format("", r"\boxed{7}", "7") == 1.0
    assert boxed_with_format("", r"\boxed{7", "7") == 0.0


def test_boxed_reward_cases():
    assert boxed("", r"so \boxed{\frac{1}{2}}", "0.5") == 1.0
    assert boxed("", r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}") == 1.0
    assert boxed("", r"\boxed{x + 1}", "x+1") == 1.0  # text answers compare normalised
    assert boxed("", r"\boxed{\left( 1, 2 \right)}", "(1,2)") == 1.0
    assert boxed("", r"\boxed{3}", r"The answer is $\boxed{3}$.") == 1.0  # MATH solution
    assert boxed("", r"\boxed{1} \boxed{2}", "1") == 0.0  # hedging: only the last box counts
    assert boxed("", "3", "3") == 0.0


def test_answers_equal_and_unknown_style():
    assert answers_equal("18.0", "18") and not answers_equal("18", "81")
    assert answers_equal(r"10^\circ", "10")
    assert answers_equal("10\u00b0", "10")  # the Unicode degree sign too
    with pytest.raises(ValueError, match="style='latex'"):
        math_reward("x", "y", "latex")


def test_rewards_are_importable_by_their_config_names():
    assert import_reward_fn("rltrain.rewards.math:gsm8k") is m.gsm8k
    assert import_reward_fn("rltrain.rewards.math:boxed_with_format") is m.boxed_with_format


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (r"\tfrac{1}{2}", r"\frac{1}{2}"),  # text-style fraction: the same number
        (r"50\%", "50"),  # an escaped percent sign
        (r"1\!000", "1000"),  # LaTeX's negative thin space
        (r"3\;cm", "3cm"),  # thick space
        (r"3\ cm", "3cm"),  # control space
    ],
)
def test_latex_spacing_and_style_commands_normalize_away(raw, normal):
    assert normalize_answer(raw) == normal
