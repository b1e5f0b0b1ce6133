"""An OpenEnv server on loopback for the adapter's tests, and its in-process twin.

The environment is calc_tool's shape: the first step is the "tool" (it answers ``=<answer>;``),
the second is scored (1.0 for the row's answer). The server runs OpenEnv's own FastAPI app
(``create_fastapi_app``) under uvicorn in a thread.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from rltrain.tasks.openenv_env import OpenEnvTextEnv


class MessageAction(Action):
    message: str


class MessageObservation(Observation):
    message: str = ""


def _answer(answer: str, turn: int, text: str) -> tuple[str, float, bool]:
    """One step of the environment: (message, reward, done)."""
    if turn == 1:
        return f"={answer};", 0.0, False
    return "", 1.0 if text.strip() == answer else 0.0, True


class AnswerEnvironment(Environment):
    """Server side: one instance per session."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.answer, self.turn, self._state = "", 0, State()

    def reset(self, seed=None, episode_id=None, answer: str = "", **kwargs: Any):
        self.answer, self.turn = answer, 0
        return MessageObservation()

    def step(self, action: MessageAction, timeout_s=None, **kwargs: Any):
        if self.answer == "boom":  # a server-side failure
            raise RuntimeError("the environment broke")
        self.turn += 1
        message, reward, done = _answer(self.answer, self.turn, action.message)
        return MessageObservation(message=message, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


class LoopbackEnv(OpenEnvTextEnv):
    """The adapter pointed at the loopback server (set by :func:`serving`)."""

    def reset_args(self, task: Any) -> dict[str, Any]:
        return {"answer": str(task.answer)}


class TwinEnv:
    """The same environment in-process, as a plain text environment."""

    def reset(self, task: Any) -> str:
        self.answer, self.turn = str(task.answer), 0
        return str(task.prompt)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.turn += 1
        message, reward, done = _answer(self.answer, self.turn, action)
        return message, reward, done, {} if done else {"tool": "LoopbackEnv"}

    def close(self) -> None:
        pass


@contextmanager
def serving(sessions: int = 64) -> Iterator[str]:
    """Run the server on a free loopback port; yields its URL (also set on LoopbackEnv)."""
    import uvicorn

    app = create_fastapi_app(
        AnswerEnvironment, MessageAction, MessageObservation, max_concurrent_envs=sessions
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            thread.join(0.05)
        assert server.started, "the OpenEnv server did not start"
        LoopbackEnv.url = f"http://127.0.0.1:{port}"
        yield LoopbackEnv.url
    finally:
        server.should_exit = True
        thread.join(10)
        LoopbackEnv.url = ""
