"""Hydra entry point: ``python -m rltrain [overrides]`` and the console script ``rltrain``.

Two sub-commands are dispatched before Hydra sees the command line: ``rltrain bench [name ...]``
(the benchmark CLI, :mod:`rltrain.bench`) and ``rltrain trace <run dir>`` (the timeline
picture, :mod:`rltrain.telemetry.draw`). A bare word is never a Hydra override (those hold ``=``
or start with ``-``, ``+`` or ``~``), so the sub-command names cannot shadow one.

Configs come from the source tree's ``conf/`` when run from a checkout, and from the installed
package ``rltrain.conf`` otherwise (the wheel ships ``conf/`` under that name).
"""

from __future__ import annotations

import os
import sys

from rltrain.scheduler.interrupts import (
    exit_interrupted,
    interrupt_received,
    interrupted,
    listen_for_interrupts,
)
from rltrain.telemetry import startup

listen_for_interrupts()  # first, before the slow imports: Ctrl-C works from the first moment

try:
    import importlib
    from collections.abc import Callable, Sequence

    import hydra
    from omegaconf import DictConfig

    from rltrain.config.store import register_configs
    from rltrain.errors import RltrainError

    _HERE = os.path.dirname(os.path.abspath(__file__))
    CONFIG_PATH = (
        "pkg://rltrain.conf"
        if os.path.isdir(os.path.join(_HERE, "conf"))
        else os.path.join(os.path.dirname(_HERE), "conf")
    )
    register_configs()
    startup.mark("imports")
except KeyboardInterrupt:  # Ctrl-C while starting up
    exit_interrupted()


#: Set while the task function runs: an error raised before it is a command-line or composition
#: mistake (Hydra's grammar, a missing group option, an unusable run directory), never a job's.
_STATE: dict[str, object] = {"entered": False, "refused": None}


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    """The Hydra task function: check the config, then run the job it describes.

    A single run that rltrain refuses (bad input, found before Ray starts) returns instead of
    raising, so Hydra adds no "Error executing job" banner; :func:`main` reports it (exit 2).
    The refusal is written to the run's ``rltrain.log``, and a run directory that holds nothing
    else is removed.
    """
    from rltrain.app import refused_run, run

    _STATE["entered"] = True
    try:
        _check_group_choices()
        return run(cfg)
    except RltrainError as exc:
        if interrupted(exc) or interrupt_received() or not refused_run(exc):  # Ctrl-C, a sweep's
            raise
        _STATE["refused"] = exc
        return None


def _check_group_choices() -> None:
    """Refuse a command line that chooses a group the chosen preset writes itself.

    Raises:
        ConfigError: see :func:`rltrain.config.presets.check_group_choices`.
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from rltrain.config.presets import check_group_choices

    if not GlobalHydra.instance().is_initialized():  # a job run by another process's launcher
        return  # (that launcher composed it; the rltrain launcher checks its jobs itself)
    hydra_cfg = HydraConfig.get()
    check_group_choices(
        GlobalHydra.instance().config_loader(),
        hydra_cfg.job.config_name,
        list(hydra_cfg.overrides.task),
    )


#: Sub-command name -> the module whose ``main(argv, prog=...)`` runs it.
SUBCOMMANDS = {"bench": "rltrain.bench.__main__", "trace": "rltrain.telemetry.draw"}


def subcommand(argv: Sequence[str]) -> Callable[[], int] | None:
    """The sub-command ``argv`` asks for, ready to run, or None for a Hydra command line.

    Args:
        argv: the arguments after the program name.

    Returns:
        A call that runs the sub-command on the remaining arguments and returns its exit code;
        None when ``argv`` does not start with a sub-command name.
    """
    if not argv or argv[0] not in SUBCOMMANDS:
        return None
    name, rest = argv[0], list(argv[1:])
    prog = f"{_program()} {name}"

    def run() -> int:
        try:
            module = importlib.import_module(SUBCOMMANDS[name])
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("rltrain.bench"):
                raise
            # The wheel does not ship the benchmarks (setup.py): they run from a checkout.
            print(
                f"{prog}: the benchmarks are not installed with the package; run them from a "
                f"source checkout of rltrain: python -m rltrain.bench [name ...]",
                file=sys.stderr,
            )
            return 2
        return module.main(rest, prog=prog)

    return run


def main() -> None:
    """Console-script entry: a sub-command, else Hydra, with configuration mistakes made short.

    Hydra prints its own errors and exits 1; asking it to re-raise lets us print one message that
    names the key, the value and the fix, and exit 2. Set HYDRA_FULL_ERROR=1 for tracebacks.
    """
    try:
        _main(sys.argv[1:])
    except KeyboardInterrupt:
        exit_interrupted()
    _before_exit()


def _before_exit() -> None:
    """The command is done: spare the interpreter's shutdown a walk over every object.

    Python's finalization runs the cyclic garbage collector over everything alive, and a
    driver that imported torch holds hundreds of thousands of objects: ~0.5 s of CPU at the end
    of every command, paid by every run of a sweep or a test suite. Freezing moves them out of
    the collector's view; atexit handlers, and finalizers driven by reference counts, still
    run (rltrain closes its own files before this point).
    """
    import gc

    gc.freeze()


def _main(argv: list[str]) -> None:
    command = subcommand(argv)
    if command is not None:
        sys.exit(command())
    if any(a in ("--help", "-h") for a in argv):
        from rltrain.help import help_text

        print(help_text(CONFIG_PATH, _program()))
        sys.exit(0)
    if "--version" in argv:
        print(version_text())
        sys.exit(0)
    from rltrain.config.errors import explain

    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except Exception as exc:  # noqa: BLE001 - classified below, re-raised when not ours
        if interrupted(exc) or interrupt_received():  # a failure while Ctrl-C was handled
            exit_interrupted()
        sweep = "-m" in argv or "--multirun" in argv
        message = explain(exc)
        if message is None and not _STATE["entered"]:
            message = explain_command_line(exc, sweep=sweep)
        if message is None or user_full_error:
            raise
        if not _STATE["entered"] and not sweep:
            message = _with_the_rest(message, argv, exc)
        print(f"rltrain: error: {message}", file=sys.stderr)
        sys.exit(2)
    if interrupt_received():  # its exception was dropped somewhere: the command was still
        exit_interrupted()  # interrupted
    if _STATE["refused"] is not None:
        print(f"rltrain: error: {_STATE['refused']}", file=sys.stderr)
        sys.exit(2)
    for note in shown_config_notes(argv):
        print(f"rltrain: note: {note}", file=sys.stderr)
    startup.mark("command_done")


def shown_config_notes(argv: Sequence[str]) -> list[str]:
    """Where ``--cfg`` prints another config than the run gets.

    Hydra prints its own composition, and merging ``key={}`` into a mapping keeps every entry;
    the run empties the mapping (:mod:`rltrain.config.overrides`), which ``--cfg`` cannot show.

    Args:
        argv: the arguments after the program name.

    Returns:
        One note per override that sets a key to ``{}``, with ``--cfg``; none without it or when
        the command line cannot be parsed (Hydra reported that already).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "--cfg" not in argv and "-c" not in argv:
        return []

    given = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(given)
    except Exception:  # noqa: BLE001 - Hydra reported its own parse error
        return []
    return [
        f"--cfg shows {o.key_or_group} as Hydra merges {o.input_line} (every entry kept); "
        f"the run empties {o.key_or_group}, then applies the overrides after "
        f"{o.input_line} in command-line order"
        for o in overrides
        if not o.is_delete() and not o.is_sweep_override() and o.value() == {}
    ]


def _with_the_rest(message: str, argv: list[str], exc: BaseException) -> str:
    """``message`` with the command line's other problems, all in one report."""
    from rltrain.app import problems_beside

    try:
        more = problems_beside(argv, CONFIG_PATH, exc)
    except Exception:  # noqa: BLE001 - a second look must never hide the first problem
        more = []
    problems = [message, *(m for m in more if m != message)]
    if len(problems) == 1:
        return message
    return f"{len(problems)} configuration problems:\n" + "\n".join(f"  - {p}" for p in problems)


def version_text() -> str:
    """``rltrain <version>``, with the versions of the libraries it runs on (from their
    installed metadata, so nothing heavy is imported)."""
    from importlib import metadata

    from rltrain import __version__

    parts = []
    for dist in ("hydra-core", "ray", "torch", "transformers"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return f"rltrain {__version__} ({', '.join(parts)})"


def explain_command_line(exc: BaseException, sweep: bool = False) -> str:
    """A mistake found before the job started: the override grammar, or Hydra's own setup.

    Args:
        exc: what Hydra raised while parsing the command line, composing the config or preparing
            the run directory (a sweep's: the sweep directory).
        sweep: whether the command is a sweep (``-m``): its directories come from
            ``hydra.sweep.dir``, not ``hydra.run.dir``.

    Returns:
        One message with the cause and the fix.
    """
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, OSError) and exc.filename:
        what, key = ("sweep", "hydra.sweep.dir") if sweep else ("run", "hydra.run.dir")
        return (
            f"cannot create the {what} directory {exc.filename!r} ({exc.strerror}): set "
            f"{key} to a writable directory (or run from one)"
        )
    if isinstance(exc, ValueError) and "integer string conversion" in first:
        return f"a number on the command line is too long ({first.split(':')[0]}): fix it"
    return (
        f"could not read the command line: {first}. Overrides look like key=value, "
        f"+new.key=value, group=option; quote values holding spaces, commas or brackets "
        f"(see https://hydra.cc/docs/advanced/override_grammar/basic/ and {_program()} --help)"
    )


def _program() -> str:
    return "python -m rltrain" if os.path.basename(sys.argv[0]) == "__main__.py" else "rltrain"


if __name__ == "__main__":
    main()
