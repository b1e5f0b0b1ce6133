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
