"""The Python-expression tool: evaluated by parsing, never executing; scored like GSM8K."""

from __future__ import annotations

import pytest

from rltrain.agents.interaction import call_end_ids
from rltrain.tasks.base import Example
from rltrain.tasks.gsm8k_tiny import build_bpe_tokenizer
from rltrain.tasks.python_tool import PythonEnv, evaluate, show
from rltrain.tasks.text_env import ToolError, load_env_class, tools_of
from rltrain.tasks.tokenizer import build_char_tokenizer


@pytest.mark.parametrize(
    ("expression", "value"),
    [("3+4", 7), ("(3+4)*2", 14), ("7/2", 3.5), ("7//2", 3), ("-2**3", -8), ("10%4", 2)],
)
def test_arithmetic_by_hand(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "x+1", "(1).real", "'a'*3", "1/0", "2**100", "9**9**9", "1+", "[1][0]"],
)
def test_anything_but_arithmetic_is_a_tool_error_shown_to_the_model(expression):
    with pytest.raises(ToolError):
        evaluate(expression)


def test_values_print_without_a_needless_decimal_point():
    assert (show(14.0), show(3.5), show(7)) == ("14", "3.5", "7")


def test_an_episode_calls_the_tool_then_is_scored_by_the_number_after_hashes():
    env = load_env_class("rltrain.tasks.python_tool:PythonEnv")()
    assert isinstance(env, PythonEnv) and set(tools_of(env)) == {"python"}
    env.reset(Example("Ava has 3 apples and buys 4 more, twice over. How many?", "#### 14"))
    assert env.step("python[(3+4)*2]") == ("=14;", 0.0, False, {"tool": "python"})
    assert env.step("python[x]")[0].startswith("=error ")
    assert env.step("=14; so #### 14")[1:3] == (1.0, True)


def test_every_token_holding_the_calls_end_ends_a_turn():
    char = build_char_tokenizer("0123456789+=[]")
    assert call_end_ids(char) == {char.convert_tokens_to_ids("]")}
    # a BPE vocabulary that merged "]" with what follows it
    bpe = build_bpe_tokenizer(["python[1+2]) x", "f(a[0]).", "b]) c"] * 50, 300)
    merged = [t for t in bpe.get_vocab() if "]" in t and t != "]"]
    assert merged  # the corpus made a merge such as "])"
    ends = call_end_ids(bpe)
    assert {bpe.convert_tokens_to_ids(t) for t in [*merged, "]"]} <= ends
    assert bpe.convert_tokens_to_ids(")") not in ends
