"""A stream of the run log that outlives its run (a logging handler keeps it) stays usable.

Ray's driver logger binds a handler to ``sys.stderr`` when Ray starts, during the first job of a
``hydra/launcher=basic`` sweep, while that job's log copies ``sys.stderr``; the handler keeps
that stream for the later jobs.
"""

from __future__ import annotations

import logging
import sys

from rltrain.telemetry.runlog import run_log


def test_a_handler_bound_during_one_run_writes_to_the_next_runs_log(tmp_path, capsys):
    first, second = tmp_path / "0.log", tmp_path / "1.log"
    logger = logging.getLogger("rltrain.tests.outlived")
    logger.propagate = False
    with run_log(str(first)):
        handler = logging.StreamHandler(sys.stderr)  # the run's tee, as Ray's handler gets it
        logger.addHandler(handler)
        logger.warning("during job 0")
    try:
        with run_log(str(second)):
            logger.warning("during job 1")
        logger.warning("between jobs")
    finally:
        logger.removeHandler(handler)
    assert first.read_text() == "during job 0\n"
    assert second.read_text() == "during job 1\n"
    err = capsys.readouterr().err
    assert err == "during job 0\nduring job 1\nbetween jobs\n"  # every line on the terminal
    assert "Logging error" not in err
