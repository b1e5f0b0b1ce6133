"""Text environments and their tools.

The protocol (what ``task.env=pkg.module:Class`` must provide; the class is built with no
arguments, one instance per episode):

- ``reset(task) -> observation``: start an episode on one task row (an object with ``prompt``
  and ``answer``); the observation is the text the model is prompted with.
- ``step(action) -> (observation, reward, done, info)``: the model's turn as text; the
  observation is appended to the conversation (tokenised once, never trained on), ``reward``
  is the episode's reward when ``done``.
- ``close()``: release what the episode held.

:class:`ToolEnv` implements the protocol for tool use: every public method with a docstring
(other than the protocol's own) is a tool the model may call with one string argument
(:mod:`rltrain.tasks.tool_format`); a turn with no call is the final answer, scored by
:meth:`ToolEnv.score`. A tool signals a bad argument by raising :class:`ToolError` (the model
reads the error and may try again); any other exception, or a call that outlives
``tools.timeout_s``, is an infrastructure failure and marks the episode infra-failed.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from rltrain.errors import ConfigError, import_user_module
from rltrain.kinds import registry
from rltrain.tasks.tool_format import final_answer, format_result, parse_call

#: The protocol's methods (never tools).
PROTOCOL = ("reset", "step", "close")


class ToolError(ValueError):
    """A tool's answer to a bad argument: shown to the model, not an infrastructure failure."""


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn text environment (see the module docstring)."""

    def reset(self, task: Any) -> str:
        """Start an episode; returns the first observation (the prompt)."""

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Take the model's turn; returns ``(observation, reward, done, info)``."""

    def close(self) -> None:
        """Release the episode's resources."""


class ToolEnv:
    """A text environment whose public documented methods are tools.

    Subclass it and add tools (``def calculator(self, expression: str) -> str`` with a
    docstring); override :meth:`score` for a reward other than exact match.
    """

    def __init__(self) -> None:
        self.task: Any = None

    def reset(self, task: Any) -> str:
        """Start an episode on ``task``; the observation is its prompt."""
        self.task = task
        return str(task.prompt)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Run the tool the turn calls, or score the final answer.

        Args:
            action: the model's turn as text.

        Returns:
            ``(observation, reward, done, info)``; ``info["tool"]`` names the tool called.

        Raises:
            Exception: whatever a tool raises other than :class:`ToolError` (the rollout marks
                the episode infra-failed).
        """
        call = parse_call(action)
        if call is None:
            return "", self.score(final_answer(action)), True, {}
        tool = tools_of(self).get(call.name)
        if tool is None:
            return format_result(f"no tool {call.name}"), 0.0, False, {"tool": call.name}
        try:
            result = str(tool(call.argument))
        except ToolError as exc:
            result = f"error {exc}"
        return format_result(result), 0.0, False, {"tool": call.name}

    def score(self, answer: str) -> float:
        """The final answer's reward: 1.0 when it equals the task's answer, else 0.0."""
        return 1.0 if answer == str(self.task.answer).strip() else 0.0

    def close(self) -> None:
        """Nothing to release."""


def tools_of(env: Any) -> dict[str, Callable[..., Any]]:
    """The tools of an environment: its public methods with a docstring, by name.

    Args:
        env: an environment instance (or class).

    Returns:
        ``name -> bound method``; the protocol's methods and :meth:`ToolEnv.score` excluded.
    """
    out = {}
    for name, member in inspect.getmembers(env, callable):
        if name.startswith("_") or name in (*PROTOCOL, "score") or inspect.isclass(member):
            continue
        if inspect.getdoc(member) and (inspect.ismethod(member) or inspect.isfunction(member)):
            out[name] = member
    return out


def load_env_class(spec: str, key: str = "task.env") -> type:
    """Import ``"pkg.module:Class"`` and check it has the protocol.

    Args:
        spec: the class's import path.
        key: the config key it came from (for the messages).

    Returns:
        The class.

    Raises:
        ConfigError: not importable, not a class, or without ``reset``/``step``/``close``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{key}={spec!r} must be 'package.module:ClassName'")
    try:
        cls = getattr(import_user_module(key, spec, module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{key}={spec!r} could not be imported ({exc}): put the module on PYTHONPATH "
            f"or fix the name"
        ) from None
    if not inspect.isclass(cls):
        raise ConfigError(f"{key}={spec!r} is not a class (one instance is built per episode)")
    missing = [m for m in PROTOCOL if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(
            f"{key}={spec!r} lacks {missing}: an environment has reset(task) -> observation, "
            f"step(action) -> (observation, reward, done, info) and close() (or subclass "
            f"rltrain.tasks.text_env.ToolEnv)"
        )
    return cls


def env_problems(run: Any) -> list[str]:
    """What stops ``task.env`` (checked before Ray starts), as messages naming the keys."""
    t, r = run.task, run.rollout
    out = []
    if t.env is None:
        if r.max_turns != 1:
            out.append(f"rollout.max_turns={r.max_turns} needs task.env (an environment)")
        if r.max_total_tokens is not None:
            out.append(f"rollout.max_total_tokens={r.max_total_tokens} needs task.env")
        return out + _idle_tool_keys(run)
    try:
        load_env_class(t.env)
    except ConfigError as exc:
        out.extend(exc.problems if hasattr(exc, "problems") else [str(exc)])
    engines = list(registry.engine_names("generation", having="multi_turn"))
    if r.backend not in engines:
        out.append(
            f"task.env runs multi-turn episodes with the engines {engines} only (got "
            f"rollout.backend={r.backend!r}): set rollout.backend={engines[0]}"
        )
    if run.trainer.partial_rollout == "continue":
        out.append(
            "task.env: episodes are not continued across weight swaps; set "
            "trainer.partial_rollout=finish or restart"
        )
    if run.reward.kind != "rule":
        out.append("task.env: the environment gives the reward; set reward.kind=rule")
    if t.reward_fn is not None:
        out.append(
            f"task.reward_fn={t.reward_fn!r} is not read with task.env (the environment scores "
            f"its episodes: override its score method): set task.reward_fn=null"
        )
    if r.max_turns < 1:
        out.append(f"rollout.max_turns={r.max_turns} must be >= 1")
    if r.max_total_tokens is not None and r.max_total_tokens < 1:
        out.append(f"rollout.max_total_tokens={r.max_total_tokens} must be >= 1")
    out += _tool_key_problems(run.tools)
    if not 0 <= run.simulate.tool_failure_rate <= 1:
        out.append(f"simulate.tool_failure_rate={run.simulate.tool_failure_rate} must be in [0, 1]")
    return out


def _idle_tool_keys(run: Any) -> list[str]:
    """``tools.*`` set, or ``tools`` placed, in a run without ``task.env``: it would start no
    tool workers, so nothing would read them."""
    from rltrain.config.schema import ToolsConfig

    out = []
    default = ToolsConfig()
    for f in dataclasses.fields(ToolsConfig):
        value = getattr(run.tools, f.name)
        if value != getattr(default, f.name):
            out.append(
                f"tools.{f.name}={value!r} is set but the run has no task.env: a single-turn run "
                f"starts no tool workers. Remove it, or set task.env to an environment"
            )
    for name in ("tool_latency_ms", "tool_failure_rate"):
        value = getattr(run.simulate, name)
        if value:
            out.append(
                f"simulate.{name}={value!r} is set but the run has no task.env: a single-turn "
                f"run calls no tools. Remove it, or set task.env to an environment"
            )
    placement = getattr(getattr(run, "placement", None), "component_placement", None) or {}
    if any("tools" in {n.strip() for n in str(k).split(",")} for k in placement):
        out.append(
            "placement.component_placement places tools but the run has no task.env: a "
            "single-turn run has no tool pool. Remove the entry, or set task.env"
        )
    return out


def _tool_key_problems(tools: Any) -> list[str]:
    """Out-of-range ``tools.*`` values of a run with ``task.env``."""
    out = []
    if tools.pool_size < 1:
        out.append(f"tools.pool_size={tools.pool_size} must be >= 1 (tool worker actors)")
    if not tools.cpus_per_worker > 0:
        out.append(f"tools.cpus_per_worker={tools.cpus_per_worker} must be > 0")
    if not tools.memory_gib_per_worker > 0:
        out.append(f"tools.memory_gib_per_worker={tools.memory_gib_per_worker} must be > 0")
    if tools.timeout_s <= 0:
        out.append(f"tools.timeout_s={tools.timeout_s} must be > 0")
    if tools.concurrency < 1:
        out.append(f"tools.concurrency={tools.concurrency} must be >= 1")
    if tools.slots < 0:
        out.append(f"tools.slots={tools.slots} must be >= 0 (0: every episode of the batch)")
    return out
