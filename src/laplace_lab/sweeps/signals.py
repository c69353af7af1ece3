"""SIGTERM and SIGINT end a run or a sweep as a failure, never as a quiet success.

SLURM time limits, preemption and ``kill`` send SIGTERM; Ctrl+C sends SIGINT. Left alone, Lightning
turns SIGTERM into "stop training early", after which the run evaluated and exited 0 as if it had
finished, and a multirun's killed job stayed ``running`` with no summary. Here:

- ``install()`` makes both signals raise ``JobInterrupted`` (a ``BaseException``, like
  ``KeyboardInterrupt``, so neither ``except Exception`` in the job nor Hydra's job runner swallows
  it) in the main thread, wherever it is: training (Lightning chains this handler after its own), the
  Laplace fit, the evaluation. Signals arriving while the interruption is handled are ignored.
- ``sweeps.jobs.run_tracked`` marks the job ``failed`` in its ``status.json`` (``interrupted``: the
  signal's name; a relaunch runs it again, from its last checkpoint with
  ``checkpoint.resume_from=last``) and lets the exception go on.
- ``on_interrupt(fn)``: ``fn(err)`` runs once the exception reaches the entry point (the
  ``SweepSummary`` callback writes the sweep's ``summary.json`` there).
- ``exit_on_interrupt(main)``: the entry point's wrapper: installs the handlers, runs the
  ``on_interrupt`` functions and exits with status ``128 + signal number`` (143 for SIGTERM, 130
  for SIGINT).
- A job in a worker process of a launcher (``submitit_local`` / SLURM, Ray) does not pass through
  the entry point: submitit's own handler there logs "Bypassing signal SIGTERM" and lets the job
  run on. ``install_in_worker()`` (``sweeps.jobs`` calls it for every job) installs the handlers
  in such a process, and ``in_worker()`` tells ``sweeps.jobs`` to end it with the exit status
  above once the job is marked ``interrupted`` (no silent retry: a relaunch runs it again).
  The launcher forwards the signal to its workers and waits for them (``sweeps.children``).
- ``deferred()``: while the main thread waits inside foreign C code that must not see an exception
  from a Python signal handler (Ray's ``ray.get`` hangs when one is raised in it), a signal is only
  recorded; ``raise_pending()`` raises it as ``JobInterrupted`` from plain Python code
  (``sweeps.ray_launch`` polls it between short waits). It also re-installs the handlers that
  foreign code replaced (Ray's driver puts its own ``sys.exit`` / abort handlers in place).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)
HANDLED = (signal.SIGTERM, signal.SIGINT)
RAY_WORKER = "default_worker.py"  # the script of Ray's worker processes
_finalizers: list[Callable[[JobInterrupted], None]] = []
_state: dict[str, Any] = {"interrupted": None, "entry": False, "pending": None}


class JobInterrupted(BaseException):
    """A SIGTERM / SIGINT arrived; ``signum`` is its number, ``exit_code`` 128 + it."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        self.exit_code = 128 + self.signum
        super().__init__(f"interrupted by {self.signal_name}")


def _handler(signum: int, frame: Any) -> None:
    if _state["interrupted"] is not None:  # already stopping: let the clean-up finish
        log.warning("%s received again while stopping after %s: ignored", signal.Signals(signum).name,
                    _state["interrupted"].signal_name)
        return
    err = JobInterrupted(signum)
    _state["interrupted"] = err
    log.error("Received %s: stopping (the job is marked failed; rerun the command to run it again)", err.signal_name)
    raise err


def install() -> bool:
    """Handle SIGTERM and SIGINT as above (main thread only); returns whether it could."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _state["interrupted"] = None
    for signum in HANDLED:
        signal.signal(signum, _handler)
    return True


def _record(signum: int, frame: Any) -> None:
    """The handler inside ``deferred()``: remember the first signal, raise nothing."""
    if _state["pending"] is None:
        _state["pending"] = signum
        log.error("Received %s: stopping at the next check", signal.Signals(signum).name)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, SIGTERM / SIGINT are recorded instead of raised (``raise_pending`` raises them);
    ``reinstall()`` inside puts the recording handler back after foreign code replaced it. On exit the
    handlers of before are restored (main thread only; elsewhere this does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in HANDLED}
    _state["pending"] = None
    reinstall()
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def reinstall() -> None:
    """(Inside ``deferred()``, main thread) the recording handler for SIGTERM and SIGINT, again."""
    if threading.current_thread() is threading.main_thread():
        for signum in HANDLED:
            signal.signal(signum, _record)


def raise_pending() -> None:
    """Raise ``JobInterrupted`` for a signal recorded inside ``deferred()`` (once), else nothing."""
    signum, _state["pending"] = _state["pending"], None
    if signum is not None:
        err = JobInterrupted(signum)
        _state["interrupted"] = err
        raise err


def in_worker() -> bool:
    """Whether this process is a launcher's worker (submitit's task process: ``SUBMITIT_FOLDER`` is
    set; a Ray worker: ``default_worker.py``) that runs jobs without the entry point's wrapper."""
    worker = "SUBMITIT_FOLDER" in os.environ or os.path.basename(sys.argv[0] if sys.argv else "") == RAY_WORKER
    return worker and not _state["entry"]


def install_in_worker() -> bool:
    """In a launcher's worker process: ``install()`` (replacing submitit's SIGTERM bypass); returns
    whether it did (not in the entry point's process, nor outside the main thread)."""
    return in_worker() and install()


def on_interrupt(fn: Callable[[JobInterrupted], None]) -> None:
    """Run ``fn(err)`` when an interruption reaches ``exit_on_interrupt`` (once, in registration order)."""
    _finalizers.append(fn)


def remove(fn: Callable[[JobInterrupted], None]) -> None:
    if fn in _finalizers:
        _finalizers.remove(fn)


def finish(err: JobInterrupted) -> None:
    """Run and forget the ``on_interrupt`` functions; an error in one is logged, the others still run."""
    while _finalizers:
        fn = _finalizers.pop(0)
        try:
            fn(err)
        except Exception as exc:  # noqa: BLE001 - the exit status already says the run failed
            log.error("while stopping after %s: %s: %s", err.signal_name, type(exc).__name__, exc)


def exit_on_interrupt(main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an entry point: ``install()``, then on ``JobInterrupted`` ``finish`` and exit 128 + signum."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _state["entry"] = True
        install()
        try:
            return main(*args, **kwargs)
        except JobInterrupted as err:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # no second interruption of the clean-up
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            finish(err)
            print(f"Stopped by {err.signal_name} (exit status {err.exit_code})", file=sys.stderr)
            sys.exit(err.exit_code)

    return wrapper
