"""The run's log: what the terminal shows, also in ``rltrain.log`` in the run directory.

:func:`run_log` copies everything the process prints (``sys.stdout`` and ``sys.stderr``: the
plan, notes and warnings, progress lines, the workers' output Ray forwards, the summary) into
the log file, as plain lines: a carriage-return redraw keeps only its last state and terminal
colour codes are dropped. A stream that outlives its run (a logging handler that took
``sys.stderr`` during one job of a sweep, as Ray's driver logger does, and keeps it) writes to
the terminal and to the log of the run active then, if any. A live progress bar draws on the
terminal only (:func:`terminal`); its lines reach the log through :func:`log_only`, at the
cadence a log file gets. Pure standard library: no Ray, no torch.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")

#: The log file of the active :func:`run_log`, if any.
_ACTIVE: list[_LogFile] = []


class _LogFile:
    """Complete lines into one file, from any thread."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by run_log
        self.lock = threading.Lock()
        self.partial: dict[int, str] = {}
        self.closed = False

    def write(self, stream: int, text: str) -> None:
        with self.lock:
            if self.closed:  # a late write from another thread: the run is over
                return
            pending = self.partial.get(stream, "") + text
            *lines, rest = pending.split("\n")
            self.partial[stream] = rest
            for line in lines:
                self.file.write(_ANSI.sub("", line.rsplit("\r", 1)[-1]) + "\n")
            if lines:
                self.file.flush()

    def close(self) -> None:
        with self.lock:
            for rest in self.partial.values():
                if rest.strip():
                    self.file.write(_ANSI.sub("", rest.rsplit("\r", 1)[-1]) + "\n")
            self.closed = True
            self.file.close()


class _Tee(io.TextIOBase):
    """A text stream that writes to the terminal's stream and to the run's log."""

    def __init__(self, terminal: TextIO, log: _LogFile, stream: int) -> None:
        self.terminal = terminal
        self._log = log
        self._stream = stream

    def write(self, text: str) -> int:
        self.terminal.write(text)
        log: _LogFile | None = self._log
        if self._log.closed:  # held past its run (by a logging handler): the current run's log
            log = _ACTIVE[-1] if _ACTIVE else None
        if log is not None:
            log.write(self._stream, text)
        return len(text)

    def flush(self) -> None:
        self.terminal.flush()

    def isatty(self) -> bool:
        return self.terminal.isatty()

    def fileno(self) -> int:
        return self.terminal.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.terminal, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.terminal, name)


@contextlib.contextmanager
def run_log(path: str) -> Iterator[None]:
    """Copy what the process prints into ``path`` (appended) while the block runs.

    Args:
        path: the log file (the run directory's ``rltrain.log``).
    """
    log = _LogFile(path)
    saved = sys.stdout, sys.stderr
    sys.stdout = _Tee(saved[0], log, 1)  # type: ignore[assignment]
    sys.stderr = _Tee(saved[1], log, 2)  # type: ignore[assignment]
    _ACTIVE.append(log)
    try:
        yield
    finally:
        _ACTIVE.remove(log)
        sys.stdout, sys.stderr = saved
        log.close()


def terminal(stream: TextIO) -> TextIO:
    """The terminal behind ``stream`` (``stream`` itself when no log copies it): where a live
    display draws, so that its redraws stay out of the log."""
    return getattr(stream, "terminal", stream)


def log_only(line: str) -> None:
    """Write one line to the active run log only (nothing when there is none)."""
    if _ACTIVE:
        _ACTIVE[-1].write(0, line.rstrip("\n") + "\n")
