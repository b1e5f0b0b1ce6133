"""Two refused runs started in the same second share Hydra's run directory (named to the
second): the first removes it, the second must still exit 2 rather than crash."""

from __future__ import annotations

import os

from rltrain.app import _remove_if_untouched, note_before_run


def test_a_run_directory_already_removed_counts_as_gone(tmp_path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        run = tmp_path / "outputs" / "2026-11-26" / "22-10-00"
        note_before_run(str(run))  # before Hydra creates it
        (run / ".hydra").mkdir(parents=True)
        assert _remove_if_untouched(str(run)) is True  # only Hydra's files: removed
        assert not (tmp_path / "outputs").exists()  # with the parents this run created
        assert _remove_if_untouched(str(run)) is True  # the second refused run: gone already
        kept = tmp_path / "kept"
        note_before_run(str(kept))
        kept.mkdir()
        (kept / "metrics.jsonl").write_text("{}\n")
        assert _remove_if_untouched(str(kept)) is False and kept.exists()
    finally:
        os.chdir(cwd)
