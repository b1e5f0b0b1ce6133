"""OpenEnv environments as rltrain text environments (``task.env``).

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ serves an environment over HTTP/WebSocket
(``openenv-core``: ``create_app(env, Action, Observation)`` on the server, an ``EnvClient`` per
session on the client). :class:`OpenEnvTextEnv` is the rltrain protocol on top of OpenEnv's own
client: each episode opens one session on the server (``reset``), each model turn is one
``step``, and ``close`` ends the session. Subclass it to say where the server is and how text
maps to the environment's action and back::

    class MyEnv(OpenEnvTextEnv):
        url = "http://10.0.0.5:8000"

        def action(self, text):           # the model's turn -> the Action's fields
            return {"code": text}

        def observation_text(self, observation):  # the Observation's fields -> text
            return observation["stdout"]

and run with ``task.env=my_pkg.envs:MyEnv``. The task's rows still give the prompts (the reset
observation is the row's prompt unless :meth:`OpenEnvTextEnv.prompt` says otherwise); the
server's ``reward`` and ``done`` end and score the episode. A step the server fails (its
environment raised, the session broke) fails its episode as an infrastructure failure, left
out of the loss; a server that cannot be reached when an episode starts fails the run with
OpenEnv's connection error.

``openenv-core`` (``pip install .[openenv]``) is imported when an episode starts, so rltrain
runs without it.
"""

from __future__ import annotations

from typing import Any


class OpenEnvTextEnv:
    """An OpenEnv server's environment behind the rltrain text-environment protocol.

    Attributes:
        url: the server (``http://host:port`` or ``ws://...``); subclasses set it.
        connect_timeout_s: how long opening a session may take.
        message_timeout_s: how long one reset or step may take on the server.
    """

    url: str = ""
    connect_timeout_s: float = 10.0
    message_timeout_s: float = 60.0

    def __init__(self) -> None:
        self.client: Any = None
        self.task: Any = None

    # ------------------------------------------------------------ what a subclass may change
    def reset_args(self, task: Any) -> dict[str, Any]:
        """Keyword arguments of the server's ``reset`` for this task row (default: none)."""
        del task
        return {}

    def prompt(self, task: Any, observation: Any) -> str:
        """The text the model is prompted with (default: the task row's prompt)."""
        del observation
        return str(task.prompt)

    def action(self, text: str) -> dict[str, Any]:
        """The environment's action for the model's turn (default: ``{"message": text}``)."""
        return {"message": text}

    def observation_text(self, observation: Any) -> str:
        """The text shown to the model after a step (default: the ``message`` field)."""
        if isinstance(observation, dict):
            return str(observation.get("message", ""))
        return str(getattr(observation, "message", ""))

    # ----------------------------------------------------------------------- the protocol
    def reset(self, task: Any) -> str:
        """Open a session on the server and reset it; the observation is the prompt.

        Raises:
            ValueError: no ``url`` set (subclass and set it).
            Exception: what OpenEnv's client raises when the server cannot be reached.
        """
        from openenv.core import GenericEnvClient

        if not self.url:
            raise ValueError(f"{type(self).__name__}.url is not set: subclass OpenEnvTextEnv")
        self.task = task
        client = GenericEnvClient(
            base_url=self.url,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.message_timeout_s,
        )
        self.client = client.sync()
        self.client.connect()
        result = self.client.reset(**self.reset_args(task))
        return self.prompt(task, result.observation)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Send the model's turn as one step; ``(observation, reward, done, info)``.

        ``info["tool"]`` names the environment for a step that does not end the episode (it
        counts in ``rollout/tool_calls``).
        """
        result = self.client.step(self.action(action))
        done = bool(result.done)
        info = {} if done else {"tool": type(self).__name__}
        reward = float(result.reward) if result.reward is not None else 0.0
        return self.observation_text(result.observation), reward, done, info

    def close(self) -> None:
        """End the session on the server."""
        if self.client is not None:
            self.client.close()
            self.client = None
