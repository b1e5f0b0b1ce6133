"""whatif's baseline: the real runs in full mode; --quick's read-back numbers are labelled so."""

from __future__ import annotations

from rltrain.bench.measures import whatif
from rltrain.bench.measures.whatif import QUICK, Outcome, table


def test_full_mode_times_the_predictions_against_the_real_runs_of_the_same_scenarios(
    monkeypatch,
):
    monkeypatch.setenv(whatif.GROUPS_ENV, QUICK[0].group)
    suite = whatif.whatif(False)
    try:
        real, alone = suite.cases
        n = sum(s.group == QUICK[0].group for s in whatif.SCENARIOS)
        assert suite.baseline == real.name and real.name.startswith(f"{n} scenarios x ")
        assert alone.name == f"{n} scenarios predicted alone" and alone.baseline is None
        assert "The real runs (start-up included) are the baseline" in suite.note
    finally:
        suite.teardown()


def test_quick_mode_has_one_case_and_its_table_says_the_runs_are_read_back(capsys):
    suite = whatif.whatif(True)
    extras = suite.extras()  # no case ran: no outcome, and a ranking of 64 devices
    suite.teardown()  # prints the (empty) table
    assert extras["readback/runs"] == 0 and "runs" not in extras
    assert [c.name for c in suite.cases] == [suite.baseline]
    assert "--quick runs no scenario" in suite.note
    header = capsys.readouterr().out.split("\n")[0]
    assert "predicted trace read back s/step" in header and "measured" not in header


def test_the_table_of_real_runs_says_measured():
    o = Outcome(QUICK[0], measured_s=1.0, predicted_s=1.1)
    assert "| measured s/step |" in table([o]) and "read back" not in table([o])
    assert "| predicted trace read back s/step |" in table([o], replayed=True)


def test_the_predictions_case_predicts_a_scenario_without_running_it(tmp_path):
    whatif.predict_all([QUICK[0]], str(tmp_path))
    assert not any(tmp_path.rglob("trace.json"))  # nothing ran: no run wrote its trace
