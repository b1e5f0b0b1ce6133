"""The progress of a preparation stage: a line per tenth of the work when there is no terminal."""

from __future__ import annotations

from rltrain.telemetry.progress import StageProgress


def test_a_log_gets_a_line_at_the_start_each_tenth_and_the_end(capsys):
    with StageProgress("writing", 25) as bar:
        for i in range(25):
            bar.advance(status=f"loss {i}")
    lines = capsys.readouterr().err.splitlines()
    # start, then every 2 units (25 // 10), then the 25th
    assert [line.split(" |")[0] for line in lines] == [
        "writing: 0/25",
        *[f"writing: {n}/25" for n in range(2, 25, 2)],
        "writing: 25/25",
    ]
    assert lines[-1].endswith("| loss 24")


def test_disabled_it_shows_nothing_and_still_counts(capsys):
    with StageProgress("writing", 3, enabled=False) as bar:
        bar.advance(2)
        bar.advance(5)
    assert capsys.readouterr().err == "" and bar.done == 3
