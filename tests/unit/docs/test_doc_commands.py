"""Every command and override the README and docs/ show does what they say.

Each ``python -m rltrain ...`` command in a code block is composed and put through the same
checks training makes before Ray starts (:func:`rltrain.runners.layout.preflight`, which is what
``mode=plan`` runs; ``placement=auto`` commands, which profile on a cluster first, are checked as
far as the config); a sweep is checked job by job. A command the docs print with an
``rltrain: error:`` line must be refused with that text. Each is also run as ``mode=plan`` (the
entry point's own code): it writes its plan files and nothing else, and the reader's files and
rltrain's cache keep every byte and time stamp. Overrides quoted inline in the prose
(`` `key=value` ``) must compose on the default config. Paths written ``/path/to/...`` stand for
the reader's files: the test puts small real ones in their place.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
from collections.abc import Callable

import pytest
from doc_commands import ROOT, DocCommand, all_commands, doc_files
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from shared_cache import prepare_shared, shared_cache
from user_files import chat_checkpoint, data_file, fingerprint

from rltrain.config import load_config
from rltrain.config.errors import explain
from rltrain.config.schema import RunConfig
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError

CONF = ROOT / "conf"
COMMANDS = all_commands()
RUNS = [c for c in COMMANDS if c.is_run]


@functools.cache
def _register_configs() -> None:
    """The schemas into Hydra's ConfigStore, once per test process (a tenth of a second a
    call, and the store keeps them)."""
    register_configs()


def compose_config(overrides: list[str]):
    _register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> pathlib.Path:
    """The test run's shared cache (``tests/shared_cache.py``), not ~/.cache, with the shared
    presets' data already in it: generated here, found current, or waited for while the other
    test process generates it, so nothing else writes into it while a plan is checked. The
    other generated data sets (experiment=calc_tool, gsm8k_tool) are this module's: the first
    command of each is planned before they exist, then generates them."""
    path = shared_cache(tmp_path_factory)
    prepare_shared(path, CONF)
    return path


@pytest.fixture(autouse=True)
def _cache(cache, monkeypatch):
    monkeypatch.setenv("RLTRAIN_CACHE", str(cache))


@pytest.fixture(scope="module")
def reader(tmp_path_factory) -> pathlib.Path:
    """Where the reader's own files (the placeholders' stand-ins) live."""
    return tmp_path_factory.mktemp("reader")


@pytest.fixture(scope="module")
def placeholders(reader) -> dict[str, Callable[[str], str]]:
    """``/path/to/...`` stand-ins: config key -> a function making a real file or directory."""

    def checkpoint(placeholder: str) -> str:
        return str(chat_checkpoint(reader / "checkpoint"))

    def data(placeholder: str) -> str:
        suffix = ".parquet" if placeholder.endswith(".parquet") else ".jsonl"
        return str(data_file(reader / f"data{suffix}"))

    def directory(placeholder: str) -> str:
        return str(reader / "checkpoints")  # an output: a new directory (theirs is refused)

    return {
        "model.path": checkpoint,
        "model.tokenizer_path": checkpoint,
        "reward.model_path": checkpoint,
        "task.path": data,
        "task.eval_path": data,
        "trainer.checkpoint_dir": directory,
    }


def _fill(overrides: list[str], placeholders: dict[str, Callable[[str], str]]) -> list[str]:
    out = []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+") == "cluster.address":
            value = re.sub(r"<[^>]+>", "127.0.0.1", value)  # planning never connects
        if "/path/to/" in value:
            make = placeholders.get(key.lstrip("+"))
            assert make is not None, f"add a stand-in for {key}=/path/to/... to this test"
            value = make(value)
        out.append(f"{key}={value}")
    return out


def _loaded(overrides: list[str]) -> RunConfig | Exception:
    """The config these overrides compose, checked; or what composing or checking raised
    (each caller reports it its own way). Made once per override set, for the pre-Ray checks
    and for seeing whether the run profiles first."""
    try:
        return load_config(compose_config(overrides))
    except Exception as exc:  # noqa: BLE001 - handed to the caller
        return exc


def _refusal(run: RunConfig | Exception, tmp_path: pathlib.Path) -> str | None:
    """What rltrain says about a config (:func:`_loaded`) before Ray starts; None when it
    accepts it."""
    from rltrain.runners.layout import preflight

    try:
        if isinstance(run, Exception):
            raise run
        if run.placement.mode != "auto":  # auto profiles on the cluster: its own tests
            preflight(run, str(tmp_path))
    except Exception as exc:  # noqa: BLE001 - classified by explain, as the CLI does
        message = explain(exc)
        if message is None:
            raise
        return message
    return None


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _profiles(run: RunConfig | Exception) -> bool:
    """Whether the run places itself (``placement=auto``: it profiles on the cluster first);
    a refused config places nothing."""
    return not isinstance(run, Exception) and run.placement.mode == "auto"


#: What ``mode=plan`` may leave in its run directory.
PLAN_FILES = {"plan.json", "plan.svg", "plan_trace.json", ".rltrain_run"}


def _plan_refusal(overrides: list[str], out_dir: pathlib.Path, monkeypatch) -> str | None:
    """What ``python -m rltrain mode=plan <overrides>`` says, run as the entry point runs it
    (:func:`rltrain.app.run`, into ``out_dir``); None when it plans."""
    from rltrain import app

    plan = [o for o in overrides if o.partition("=")[0].lstrip("+") != "mode"] + ["mode=plan"]
    out_dir.mkdir()
    monkeypatch.setattr(app, "run_dir", lambda: str(out_dir))
    try:
        app.run(compose_config(plan))
    except Exception as exc:  # noqa: BLE001 - classified by explain, as the CLI does
        message = explain(exc)
        if message is None:
            raise
        return message
    return None


@pytest.mark.parametrize("command", RUNS, ids=[c.where for c in RUNS])
def test_documented_command(
    command: DocCommand, placeholders, reader, cache, tmp_path, monkeypatch
):
    """Each command passes (or is refused as shown by) the checks made before Ray starts; in
    ``mode=plan`` it writes its plan files and nothing else, anywhere: not a byte of the
    reader's files (checkpoint, data, ``trainer.checkpoint_dir``) nor of rltrain's cache."""
    for i, overrides in enumerate(command.override_sets()):
        filled = _fill(overrides, placeholders)
        loaded = _loaded(filled)
        auto = _profiles(loaded)  # mode=plan with placement=auto profiles first (it says so)
        planned = None
        if not auto:
            # first, while task.generate's data may not exist yet: a plan writes none of it
            before = fingerprint(reader), fingerprint(cache) if cache.exists() else None
            out_dir = tmp_path / f"plan{i}"
            planned = _plan_refusal(filled, out_dir, monkeypatch)
            after = fingerprint(reader), fingerprint(cache) if cache.exists() else None
            assert after == before, f"{command.where}: mode=plan wrote outside its run directory"
            written = set(os.listdir(out_dir))
            assert written <= PLAN_FILES, f"{command.where}: mode=plan wrote {written}"
            assert planned is not None or "plan.json" in written, command.where
        refusal = _refusal(loaded, tmp_path)
        if command.expect_error is None:
            assert refusal is None, f"{command.where}: {' '.join(overrides)} -> {refusal}"
            assert planned is None, f"{command.where} in mode=plan: {planned}"
        else:
            shown = _squash(command.expect_error.split("...")[0]).strip()
            assert refusal is not None, f"{command.where} is shown failing but runs"
            assert shown in _squash(refusal), f"{command.where}: {refusal}"
            assert auto or planned is not None, f"{command.where} plans but is shown failing"


def test_documented_bench_measures_exist():
    from rltrain.bench.harness import discover

    known = set(discover())
    for c in COMMANDS:
        if c.args and c.args[0] == "bench":
            names = [a for a in c.args[1:] if not a.startswith("-") and "=" not in a]
            names = [n for n in names if not re.fullmatch(r"[\d.:]+|MD", n)]
            assert set(names) <= known, f"{c.where}: unknown measures {set(names) - known}"


#: An override quoted in prose: a dotted key (or a group) and a value, nothing else.
INLINE = re.compile(r"`(\+{0,2}[a-z_]+(?:\.[a-z_0-9]+)+=[^`]+)`")


def _inline_overrides() -> list[tuple[str, str]]:
    found = []
    for path in doc_files():
        in_block = False
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_block = not in_block
            elif not in_block:
                found += [(f"{path.relative_to(ROOT)}:{i}", m) for m in INLINE.findall(line)]
    return found


INLINE_OVERRIDES = _inline_overrides()
#: Overrides the docs quote as examples of values refused on load.
SHOWN_REFUSED = {"cluster.devices_per_node=100000000": "is beyond any real cluster"}


@pytest.mark.parametrize(
    ("where", "override"), INLINE_OVERRIDES, ids=[w for w, _ in INLINE_OVERRIDES]
)
def test_documented_override_composes(where: str, override: str, placeholders):
    key, _, value = override.partition("=")
    if "<" in value or "..." in value or "|" in value or re.fullmatch(r"[A-Za-z]", value):
        pytest.skip("a pattern (<x>, ..., a|b, or a single letter), not a value")
    if override in SHOWN_REFUSED:
        with pytest.raises(ConfigError) as info:  # the doc's point: it is refused, and why
            load_config(compose_config(_fill([override], placeholders)))
        assert key in str(info.value) and SHOWN_REFUSED[override] in str(info.value)
        return
    if key.startswith("hydra."):
        pytest.skip("Hydra's own key: Hydra checks it")
    try:
        load_config(compose_config(_fill([override], placeholders)))
    except Exception as exc:  # noqa: BLE001
        message = explain(exc) or repr(exc)
        # Cross-field checks may need the rest of a documented command; the override itself
        # must exist, take its value's type and need no extra `+`.
        bad_key = ("unknown config key", "Could not override", "bad value for", "could not read")
        assert not any(b in message for b in bad_key), f"{where}: {override} -> {message}"
        # ... and a value its own key's checks accept (a problem that names this key with a
        # type or range refusal is the doc's value, not a missing part of its command)
        name = key.lstrip("+")
        bad_value = (
            "is not a whole number",
            "is not valid: choose one of",
            "must be > 0",
            "must be >= 0",
            "is not a number",
            "must be a",
        )
        own = [line for line in message.splitlines() if f"{name}=" in line]
        assert not [line for line in own if any(b in line for b in bad_value)], (
            f"{where}: {override} -> {message}"
        )


def test_the_docs_show_commands():
    assert len(RUNS) >= 20 and len(INLINE_OVERRIDES) >= 10
