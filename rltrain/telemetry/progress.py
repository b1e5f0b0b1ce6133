"""Progress of a long preparation stage (writing a data set, supervising a base checkpoint).

On a terminal: one rich bar, redrawn in place, with the stage's label and a short status. In a
log (no terminal): a line at the start, at every tenth of the work and at the end, so a log shows
the stage moving without a line per item.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any


class StageProgress:
    """A progress display for ``total`` units of one stage; use as a context manager.

    Args:
        label: what the stage does (``"gsm8k_tiny: supervising the base checkpoint"``).
        total: units of work (steps, rows).
        enabled: False shows nothing (``logging.progress=false``).
    """

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self.label, self.total, self.enabled = label, max(1, int(total)), enabled
        self.done = 0
        self._start = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        self._every = max(1, self.total // 10)

    def __enter__(self) -> StageProgress:
        if not self.enabled:
            return self
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task(self.label, total=self.total, status="")
            self._bar.start()
        else:
            self._line("")
        return self

    def advance(self, n: int = 1, status: str = "") -> None:
        """Record ``n`` more units done, with an optional short status (``"loss 0.49"``)."""
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, status=status)
        elif self.done % self._every == 0 or self.done == self.total:
            self._line(status)

    def _line(self, status: str) -> None:
        head = f"{self.label}: {self.done}/{self.total} | {time.monotonic() - self._start:5.1f}s"
        print(f"{head} | {status}" if status else head, file=sys.stderr, flush=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
