"""``logging.trace=false`` reaches the worker processes: they record no spans either."""

from __future__ import annotations

import pytest
from composed import composed_run

from rltrain.scheduler import Worker
from rltrain.telemetry import trace

pytestmark = pytest.mark.timeout(300)


class SpanWorker(Worker):
    """Records a span when built and on every call; reports what its buffer holds."""

    def __init__(self) -> None:
        with trace.span("build", "actor"):
            pass

    def work_and_count(self) -> int:
        with trace.span("work", "actor"):
            pass
        return len(trace.drain())


@pytest.mark.parametrize("enabled", [False, True], ids=["trace-off", "trace-on"])
def test_the_workers_record_spans_only_when_logging_trace_is_on(ray_session, tmp_path, enabled):
    from rltrain.runners.job import start_job

    ray_session.ensure()
    run = composed_run(
        "placement=disaggregated", f"logging.trace={str(enabled).lower()}", "logging.progress=false"
    )
    workers = {"actor": lambda layout: SpanWorker.create_group()}
    try:
        with start_job(run, str(tmp_path), workers) as job:
            held = job.groups["actor"].call(SpanWorker.work_and_count).wait()
            driver = [s for s in job.cluster.collect_spans() if s.process == "driver"]
    finally:
        trace.configure(enabled=True)  # this process's default, for the tests after
    # on: each rank's build and work spans (the driver drained none of them before)
    assert held == ([2] * len(held) if enabled else [0] * len(held))
    assert bool(driver) == enabled  # the driver's launch span
