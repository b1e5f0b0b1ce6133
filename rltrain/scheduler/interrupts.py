"""Ctrl-C that is never lost: SIGINT always interrupts, and never half-way through a teardown.

Three rules, each closing a way an interrupt went missing or left processes behind:

- :func:`listen_for_interrupts`: a process started with SIGINT ignored (a background job of a
  non-interactive shell, as CI runners and ``cmd &`` in scripts start them, inherits
  ``SIG_IGN``; Python then installs no ``KeyboardInterrupt`` handler at all) gets Python's
  handler back, so ``kill -INT`` and a terminal's Ctrl-C stop the run.
- :func:`deferred_interrupts`: code that must finish once started (stopping Ray, publishing a
  checkpoint) runs with SIGINT held; an interrupt that arrives meanwhile is raised as soon as
  it ends.
- :func:`interrupted`: an exception raised while an interrupt was being handled (a cleanup
  failing, a worker failure surfacing during teardown) still counts as the interrupt: callers
  exit 130 instead of restarting or reporting the secondary error.

Pure standard library: no Ray, no torch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

#: The exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def listen_for_interrupts() -> bool:
    """Give SIGINT Python's ``KeyboardInterrupt`` handler where it was inherited as ignored.

    Only the main thread can set signal handlers; elsewhere nothing changes. A handler someone
    installed on purpose (a callable) is kept.

    Returns:
        True when the handler was restored (SIGINT had been ignored).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT while the block runs; raise ``KeyboardInterrupt`` after it if one came.

    Off the main thread, or where SIGINT is not handled by Python's ``KeyboardInterrupt``
    handler (ignored on purpose, or a custom handler), the block runs unchanged.

    Raises:
        KeyboardInterrupt: after the block, when SIGINT arrived during it (and the block itself
            raised nothing).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised while handling, a ``KeyboardInterrupt``.

    Follows ``__cause__`` and ``__context__`` (each exception once).

    Args:
        exc: the exception to examine (None: False).
    """
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        stack += [e.__cause__, e.__context__]
    return False
