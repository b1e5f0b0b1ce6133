"""Ctrl-C that is never lost: SIGINT always interrupts, and never half-way through a teardown.

Each rule closes a way an interrupt went missing or left processes behind:

- :func:`listen_for_interrupts`: a process started with SIGINT ignored (a background job of a
  non-interactive shell, as CI runners and ``cmd &`` in scripts start them, inherits
  ``SIG_IGN``; Python then installs no ``KeyboardInterrupt`` handler at all) gets a handler,
  so ``kill -INT`` and a terminal's Ctrl-C stop the run.
- The handler also *records* the interrupt. Python raises ``KeyboardInterrupt`` wherever the
  main thread happens to be, and where that is a finalizer or a weakref callback (the import
  system's module locks have one) the exception is printed as "ignored" and dropped: the run
  would go on. :func:`check_interrupt` raises it again at the loop's next step (and the
  driver's other stage boundaries), and :func:`interrupt_received` makes the command exit 130
  whatever happened to the exception.
- :func:`deferred_interrupts`: code that must finish once started (stopping Ray, publishing a
  checkpoint) runs with SIGINT held; an interrupt that arrives meanwhile is raised as soon as
  it ends.
- :func:`interrupted`: an exception raised while an interrupt was being handled (a cleanup
  failing, a worker failure surfacing during teardown) still counts as the interrupt: callers
  exit 130 instead of restarting or reporting the secondary error.

SIGTERM (a scheduler's preemption) is a request to stop, not an interrupt:
:func:`termination_requests` records it for a whole run (:func:`termination_requested`), and
the training loop stops at its next step boundary. ``ray.init`` replaces the handler with its
own, which raises ``SystemExit(15)``: :func:`listen_for_termination` takes it back once Ray
has started, and :func:`terminated` tells that exit from a failure.

Pure standard library: no Ray, no torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from rltrain.errors import exception_chain

#: The exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


#: Set by the first SIGINT the handler sees (and by one held during a deferred block).
_RECEIVED = threading.Event()
#: Set by SIGTERM under :func:`termination_requests`.
_TERMINATE = threading.Event()
#: How many :func:`termination_requests` blocks are open (the main thread's).
_DEPTH = 0


def on_interrupt(signum: int, frame: Any) -> None:
    """The SIGINT handler: record the interrupt, then raise ``KeyboardInterrupt`` as Python's
    own handler does.

    Raises:
        KeyboardInterrupt: always.
    """
    _RECEIVED.set()
    raise KeyboardInterrupt


def listen_for_interrupts() -> bool:
    """Handle SIGINT with :func:`on_interrupt`, also where it was inherited as ignored.

    Only the main thread can set signal handlers; elsewhere nothing changes. A handler someone
    installed on purpose (a callable other than Python's default) is kept.

    Returns:
        True when the handler was installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None, signal.default_int_handler):
        return False
    signal.signal(signal.SIGINT, on_interrupt)
    return True


def interrupt_received() -> bool:
    """Whether SIGINT arrived in this process (under :func:`listen_for_interrupts`)."""
    return _RECEIVED.is_set()


def check_interrupt() -> None:
    """Raise the interrupt again if one arrived and its exception was dropped on the way.

    Call at points where stopping is safe (a step's start, between start-up stages); never in
    clean-up code, which an interrupt being handled must be able to finish.

    Raises:
        KeyboardInterrupt: SIGINT arrived in this process.
    """
    if _RECEIVED.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT while the block runs; raise ``KeyboardInterrupt`` after it if one came.

    Off the main thread, or where SIGINT is not handled by Python's ``KeyboardInterrupt``
    handler (ignored on purpose, or a custom handler), the block runs unchanged.

    Raises:
        KeyboardInterrupt: after the block, when SIGINT arrived during it (and the block itself
            raised nothing).
    """
    with held_until_released():  # never released: a SIGINT held is raised at the block's end
        yield


@contextlib.contextmanager
def held_until_released() -> Iterator[Callable[[], None]]:
    """Hold SIGINT until the yielded ``release`` is called (from any thread), then act on it.

    For the main thread's work while a second thread imports modules: a ``KeyboardInterrupt``
    raised in the main thread while another thread imports can leave CPython's import lock held
    for good (the interrupt lands inside importlib's own lock bookkeeping), and every later
    import in the other thread then waits forever — a driver that hangs on Ctrl-C instead of
    exiting. Here a SIGINT that arrives before ``release`` is recorded (``interrupt_received``
    says so at once) and delivered again when ``release`` is called; one that arrives after is
    raised as usual, wherever the main thread is. Off the main thread, or where SIGINT is not
    handled by Python's ``KeyboardInterrupt`` handler, nothing is held.

    Yields:
        ``release``: call it when the other thread has finished its imports.

    Raises:
        KeyboardInterrupt: at the end of the block, when SIGINT was held and not yet raised.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous not in (
        signal.default_int_handler,
        on_interrupt,
    ):
        yield lambda: None
        return
    released = threading.Event()
    held: list[int] = []
    raised: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if released.is_set():
            raised.append(signum)
            previous(signum, frame)  # raises KeyboardInterrupt
        held.append(signum)
        if previous is on_interrupt:
            _RECEIVED.set()

    def release() -> None:
        released.set()
        if held:  # delivered again: the main thread's handler raises it where that thread is
            os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGINT, hold)
    try:
        yield release
    finally:
        signal.signal(signal.SIGINT, previous)
    if held and not raised:
        raise KeyboardInterrupt


def exit_interrupted() -> NoReturn:
    """End the process with status 130 (Ctrl-C), every exit handler run first.

    ``sys.exit(130)`` is not enough: CPython remembers a ``KeyboardInterrupt`` that passed
    through code run by ``exec``/``eval`` of a string (dataclasses build their methods that
    way, so an import can be such code) and then ends the process with SIGINT itself, even
    when the exception was caught. Here the ``atexit`` handlers (Ray's shutdown, logging's
    flush, ``weakref.finalize``) run, the standard streams are flushed, and the process exits
    with 130 directly.
    """
    import atexit
    import os
    import sys

    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - what interpreter shutdown would run
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(EXIT_INTERRUPTED)


def interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised while handling, a ``KeyboardInterrupt``.

    Follows ``__cause__`` and ``__context__`` (each exception once).

    Args:
        exc: the exception to examine (None: False).
    """
    return any(isinstance(e, KeyboardInterrupt) for e in exception_chain(exc))


def on_terminate(signum: int, frame: Any) -> None:
    """The SIGTERM handler: record the request to stop (the loop stops at a step boundary)."""
    _TERMINATE.set()


def listen_for_termination() -> bool:
    """Handle SIGTERM with :func:`on_terminate` (again: ``ray.init`` replaces the handler with
    one that raises ``SystemExit(15)``). Only the main thread can set signal handlers.

    Returns:
        True when the handler was installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, on_terminate)
    return True


def termination_requested() -> bool:
    """Whether SIGTERM arrived under :func:`termination_requests` (or ``terminated`` saw it)."""
    return _TERMINATE.is_set()


@contextlib.contextmanager
def termination_requests() -> Iterator[None]:
    """Record SIGTERM instead of dying of it while the block (a run) runs; the handler found
    is restored after it. The outermost block forgets the request when it ends, and one an
    earlier run in this process left when it starts (a later job of the same process, a
    benchmark starting workers, must not stop for it); a nested one (the training loop's,
    inside the run's) keeps the run's.
    """
    global _DEPTH
    if _DEPTH == 0:
        _TERMINATE.clear()
    previous = signal.getsignal(signal.SIGTERM)
    installed = listen_for_termination()
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if _DEPTH == 0:
            _TERMINATE.clear()


def terminated(exc: BaseException | None) -> bool:
    """Whether ``exc`` is SIGTERM as another handler raised it: ``SystemExit(15)``, Ray's
    driver handler while ``ray.init`` runs (or an exception raised while handling one).
    Seeing one inside :func:`termination_requests` records the request for that run
    (:func:`termination_requested`); outside one nothing is recorded, since no run would forget
    it and a later job of the same process would stop for it at its start.

    Args:
        exc: the exception to examine (None: False).
    """
    if any(isinstance(e, SystemExit) and e.code == signal.SIGTERM for e in exception_chain(exc)):
        if _DEPTH > 0:
            _TERMINATE.set()
        return True
    return False
