"""What a group call's Ray error says failed (``read_failure``), from Ray's own exception
objects built in-process, passed through pickle as Ray passes them to the driver.

A failed input (another call's result passed in) needs Ray's executor to word it: that case is
in tests/integration/scheduler/test_failures.py.
"""

from __future__ import annotations

import pickle

from ray.exceptions import ActorDiedError, RayTaskError

from rltrain.scheduler.group import one_line, read_failure

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/job/workers.py", line 5, in __init__\n'
    "TypeError: bad argument in worker __init__\n"
)


def task_error(function_name: str, cause: BaseException) -> RayTaskError:
    return RayTaskError(
        function_name,
        TRACEBACK,
        cause,
        proctitle=f"ray::Bad.{function_name}",
        pid=4242,
        ip="127.0.0.1",
        actor_repr="<Bad object>",
        actor_id="ab" * 16,
    )


def test_an_exception_in_init_is_read_as_such_with_its_cause_not_as_a_death():
    # Ray reports a creation task's exception as the actor's death (ActorDiedError).
    died = ActorDiedError(task_error("__init__", TypeError("bad argument in worker __init__")))
    failure = read_failure(pickle.loads(pickle.dumps(died)))
    assert failure.kind == "init"
    assert isinstance(failure.cause, TypeError)
    assert str(failure.cause) == "bad argument in worker __init__"


def test_a_process_death_has_no_cause():
    failure = read_failure(pickle.loads(pickle.dumps(ActorDiedError())))
    assert failure.kind == "died" and failure.cause is None and failure.actor_id == ""


def test_a_death_names_the_actor_that_died():
    # What a call whose input came from a dead worker gets: that worker's death, its actor id.
    died = ActorDiedError()
    died.actor_id = "cd" * 16
    failure = read_failure(pickle.loads(pickle.dumps(died)))
    assert failure.kind == "died" and failure.actor_id == "cd" * 16


def test_a_method_that_raised_gives_its_exception():
    # The driver gets the RayTaskError and raises it as an instance of the cause's class too.
    raised = pickle.loads(pickle.dumps(task_error("train", ValueError("bad batch"))))
    failure = read_failure(raised.as_instanceof_cause())
    assert failure.kind == "raised" and isinstance(failure.cause, ValueError)
    assert failure.task == "" and failure.actor_id == ""


def test_one_line_names_type_and_first_line():
    assert one_line(ValueError("first\nsecond")) == "ValueError: first"
    assert one_line(KeyError()) == "KeyError"
    assert one_line(RuntimeError("x" * 300)) == "RuntimeError: " + "x" * 199 + "…"


def test_a_timeout_from_a_config_key_names_the_key_and_the_fix():
    from types import SimpleNamespace

    from rltrain.scheduler.group import GroupFuture

    future = GroupFuture(SimpleNamespace(name="actor"), [0, 1], [], "_rltrain_join_collective")
    text = str(future._timeout(330.0, [1], "cluster.collective_timeout_s"))
    assert text.startswith(
        "group 'actor'._rltrain_join_collective: ranks [1] did not answer within 330 s (set from "
        "cluster.collective_timeout_s): raise cluster.collective_timeout_s if they are slow"
    )
    # a caller's own wait, with no key, may wait again
    assert "wait again" in str(future._timeout(5.0, [1]))
