"""The three ways Ctrl-C went missing, each shown in a fresh Python process: an inherited
SIG_IGN, a KeyboardInterrupt dropped by a finalizer, and CPython ending a process with SIGINT
after an interrupt passed through exec'd code although the program asked for exit 130.

(The whole run interrupted at many moments is tests/integration/reliability/test_interrupts.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rltrain.scheduler.interrupts import deferred_interrupts, interrupted


def python(code: str, ignore_sigint: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (optionally started with SIGINT ignored)."""

    def preexec() -> None:
        if ignore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=preexec,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_an_inherited_sig_ign_gets_a_handler():
    out = python(
        """
        import os, signal, time
        from rltrain.scheduler.interrupts import listen_for_interrupts
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert listen_for_interrupts()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            print("interrupted")
        """,
        ignore_sigint=True,
    )
    assert out.stdout.strip() == "interrupted", out.stderr


def test_an_interrupt_a_finalizer_dropped_is_raised_again():
    out = python(
        """
        import os, signal, time
        from rltrain.scheduler.interrupts import (
            check_interrupt, interrupt_received, listen_for_interrupts)

        class Finalized:
            def __del__(self):  # Python drops an exception raised here
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)

        listen_for_interrupts()
        Finalized()  # its KeyboardInterrupt is "ignored"
        print("went on", interrupt_received())
        try:
            check_interrupt()
        except KeyboardInterrupt:
            print("raised again")
        """
    )
    assert "Exception ignored" in out.stderr  # the interrupt was dropped by Python ...
    assert out.stdout.split() == ["went", "on", "True", "raised", "again"]  # ... not by us


@pytest.mark.parametrize(
    ("exit_with", "code"), [("sys.exit(130)", -2), ("exit_interrupted()", 130)]
)
def test_exit_130_after_an_interrupt_in_execd_code(exit_with, code, tmp_path):
    # run as `python -m`, as rltrain is: then CPython checks, after the program's own exit, a
    # flag that an interrupt leaving exec'd code set (dataclasses exec their methods' source)
    (tmp_path / "interrupted_main.py").write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys, time
            from rltrain.scheduler.interrupts import exit_interrupted, listen_for_interrupts
            listen_for_interrupts()
            try:
                exec("os.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(5)")
            except KeyboardInterrupt:
                {exit_with}
            """
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "interrupted_main"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == code, out.stderr  # sys.exit(130) ends as death by SIGINT


def test_a_deferred_block_finishes_then_raises():
    done = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("finished")  # not cut short
    assert done == ["finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_failure_while_handling_an_interrupt_is_the_interrupt():
    try:
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("clean-up failed")
    except RuntimeError as exc:
        assert interrupted(exc)
    assert not interrupted(RuntimeError("a plain failure"))


@pytest.fixture
def python_handles_sigint():
    """Python's own SIGINT handler for the test (a test process may have another), restored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _sigint() -> None:
    """SIGINT to this process (the main thread acts on it at its next instruction)."""
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_held_until_released_then_raised_where_the_main_thread_is(python_handles_sigint):
    """The fourth way: a KeyboardInterrupt in the main thread while another thread imports can
    leave the interpreter's import lock held, and the driver then waits for that thread
    forever; here Ctrl-C waits for ``release`` (called when the other thread's imports end,
    from that thread), then is raised in the main thread wherever it is."""
    import threading

    from rltrain.scheduler.interrupts import held_until_released

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with held_until_released() as release:
            _sigint()
            reached.append("held")  # the block went on
            helper = threading.Thread(target=release)
            helper.start()
            helper.join()
            for _ in range(100_000):  # raised in here, not at the block's end
                reached.append("after release")
    assert reached[0] == "held" and len(reached) < 100_001
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_after_release_is_raised_at_once_and_no_ctrl_c_raises_nothing(
    python_handles_sigint,
):
    from rltrain.scheduler.interrupts import held_until_released

    with held_until_released() as release:
        release()
        with pytest.raises(KeyboardInterrupt):
            _sigint()
            for _ in range(100_000):
                pass
    with held_until_released() as release:
        release()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_held_and_never_released_is_raised_when_the_block_ends(python_handles_sigint):
    from rltrain.scheduler.interrupts import held_until_released

    after = []
    with pytest.raises(KeyboardInterrupt):
        with held_until_released():
            _sigint()
            after.append("the block finished")
    assert after == ["the block finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
