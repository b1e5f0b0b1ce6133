"""How a tool call and its result are written in the model's text.

A call is ``name[argument]``: the tool's name, its one string argument, and a closing ``]``
that ends the model's turn (the rollout stops sampling there, as at EOS). The result comes
back as ``=result;`` and the model goes on after it. The format needs only a few characters,
so the built-in one-character-per-token tokenizer can spell it (``experiment=calc_tool``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The character that closes a call and ends the model's turn.
CALL_END = "]"
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[([^\[\]]*)\]\s*$")


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its argument text."""

    name: str
    argument: str


def parse_call(action: str) -> ToolCall | None:
    """The call a turn ends with, or None when the turn is a final answer.

    Args:
        action: the model's turn as text (EOS not included).

    Returns:
        The call when ``action`` ends with ``name[argument]``.
    """
    m = _CALL.search(action)
    return ToolCall(m.group(1), m.group(2)) if m else None


def format_call(name: str, argument: str) -> str:
    """``name[argument]`` (demonstrations write calls this way)."""
    return f"{name}[{argument}{CALL_END}"


def format_result(result: str) -> str:
    """The observation text appended after a call: ``=result;``."""
    return f"={result};"


def final_answer(action: str) -> str:
    """The answer of a final turn: the text after the last tool result, stripped."""
    return action.rsplit(";", 1)[-1].strip()
