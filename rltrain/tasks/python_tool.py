"""A Python-expression tool for word problems: ``task.env=rltrain.tasks.python_tool:PythonEnv``.

The second built-in tool environment (``calc_tool``'s calculator is the first): the model may
write ``python[<expression>]`` to have an arithmetic Python expression evaluated (``=<value>;``
comes back), and its final turn is scored as GSM8K answers are, by the number after ``####``
(so ``task.reward_fn`` is null beside it). ``experiment=gsm8k_tool`` trains a word-problem agent
with it, from a checkpoint supervised on solutions that call the tool (docs/agents.md)::

    python -m rltrain experiment=gsm8k_tool

The expression is parsed, never executed: numbers, ``+ - * / // % **`` and parentheses only,
with bounded powers, so a model cannot reach the interpreter through the tool.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from rltrain.rewards.math import gsm8k
from rltrain.tasks.text_env import ToolEnv, ToolError

#: The operators an expression may use.
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
#: Limits that keep one call cheap: the longest expression, the largest exponent and value.
MAX_CHARS, MAX_EXPONENT, MAX_MAGNITUDE = 200, 64, 10**30


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic Python expression.

    Args:
        expression: numbers, ``+ - * / // % **`` and parentheses.

    Returns:
        Its value.

    Raises:
        ToolError: anything else (names, calls, attributes, strings), a syntax error, division
            by zero, or a value past the limits; the model is shown the message.
    """
    if len(expression) > MAX_CHARS:
        raise ToolError(f"longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"syntax: {exc.msg}") from None
    try:
        value = _value(tree.body)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    if abs(value) > MAX_MAGNITUDE:
        raise ToolError("too large")
    return value


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent over {MAX_EXPONENT}")
        out = _BINARY[type(node.op)](left, right)
        if isinstance(out, complex) or abs(out) > MAX_MAGNITUDE:
            raise ToolError("too large")
        return out
    raise ToolError(f"only numbers and + - * / // % ** ( ), not {type(node).__name__}")


def show(value: int | float) -> str:
    """A value as the tool prints it: whole numbers without a decimal point."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class PythonEnv(ToolEnv):
    """Word problems with a ``python`` tool; the final answer is scored like GSM8K's."""

    def python(self, expression: str) -> str:
        """Evaluate an arithmetic Python expression such as ``(3+4)*2`` and return its value."""
        return show(evaluate(expression))

    def score(self, answer: str) -> float:
        """1.0 when the number after the final turn's last ``####`` is the task's answer."""
        return gsm8k("", answer, str(self.task.answer))
