"""The progress display: a live bar on a terminal, a few lines in a log."""

from __future__ import annotations

from types import SimpleNamespace

from rltrain.telemetry.metrics import MetricsLogger


def test_a_log_gets_a_line_per_tenth_of_the_run_and_each_evaluation(tmp_path, capsys):
    logger = MetricsLogger(
        str(tmp_path),
        SimpleNamespace(
            jsonl=False, tensorboard=False, wandb=False, mlflow=False, progress=True, project="p"
        ),
    )
    for step in range(1, 101):
        record = {"reward/mean": step / 100}
        if step == 37:
            record["eval/accuracy"] = 0.5
        logger.progress(step, 100, record)
    logger.close()
    lines = capsys.readouterr().err.strip().splitlines()  # pytest's stderr is no terminal
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert steps == [1, 10, 20, 30, 37, 40, 50, 60, 70, 80, 90, 100]
    assert "eval acc 0.5" in lines[4] and "reward 1" in lines[-1]


def test_progress_off_prints_nothing(tmp_path, capsys):
    logger = MetricsLogger(
        str(tmp_path),
        SimpleNamespace(
            jsonl=False, tensorboard=False, wandb=False, mlflow=False, progress=False, project="p"
        ),
    )
    logger.progress(1, 10, {"reward/mean": 1.0})
    logger.close()
    assert capsys.readouterr().err == ""
