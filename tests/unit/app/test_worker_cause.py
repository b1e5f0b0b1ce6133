"""One reading of a worker's failure and of this invocation's records, wherever they are used:
the worker's own exception under Ray's wrapper (:func:`rltrain.errors.worker_cause`), and the
records of an ended run's summary (:func:`rltrain.telemetry.summary.this_invocations`)."""

from __future__ import annotations

from composed import composed_run

from rltrain import app
from rltrain.errors import WorkerError, worker_cause


class _TaskError(Exception):
    """What Ray raises for a remote call that raised: the worker's exception as ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("task failed")
        self.cause = cause


def failed_with(cause: BaseException | None) -> WorkerError:
    err = WorkerError("group 'actor' rank 0 (node 0, pid 1234): 'train' raised")
    err.cause, err.where = cause, "group 'actor' rank 0 'train'"
    return err


def test_the_workers_own_exception_is_found_under_rays_wrapper_or_without_it():
    inner = TypeError("unsupported operand")
    assert worker_cause(failed_with(_TaskError(inner))) is inner
    assert worker_cause(failed_with(inner)) is inner
    assert worker_cause(failed_with(None)) is None  # the process died


def test_the_cause_line_and_the_restart_policy_read_the_same_exception():
    failure = failed_with(_TaskError(TypeError("unsupported operand")))
    assert app._cause(failure) == "TypeError: unsupported operand in group 'actor' rank 0 'train'"


def test_an_ended_runs_final_reward_comes_from_the_records_its_means_use():
    # steps 0-1 are an earlier invocation's; this one started at step 2; the last record names
    # no step, and the summary's means count it as this invocation's: so does final_reward
    records = [
        {"step": 0, "reward/mean": 0.1},
        {"step": 1, "reward/mean": 0.2},
        {"step": 2, "reward/mean": 0.3},
        {"reward/mean": 0.4},
    ]
    attempts = [{"attempt": 1, "first_step": 2, "done_steps": 3, "training_s": 1.0}]
    summary = app.ended_summary(composed_run(), RuntimeError("x"), attempts, [], records)
    assert summary["final_reward"] == 0.4
