"""``laplace_lab.train`` that sends itself a signal at a chosen point, for the signal tests.

    LAB_SIGNAL=TERM LAB_SIGNAL_AT=training python tests/sweeps/signal_app.py -m ...

``LAB_SIGNAL``: ``TERM`` or ``INT``. ``LAB_SIGNAL_AT``: ``training`` (the third training step of
the process, under whichever loop runs) or ``laplace_fit`` (the first batch of the first post-hoc
Laplace fit). The signal is sent once per process with ``os.kill`` to itself, so it arrives at
that point for sure; everything else is the real entry point (``laplace_lab.train.main``).
"""

from __future__ import annotations

import os
import signal

import laplace_lab.train as train_mod
from laplace_lab.laplace import Laplace
from laplace_lab.training.module import MAPCore

SIGNUM = {"TERM": signal.SIGTERM, "INT": signal.SIGINT}[os.environ.get("LAB_SIGNAL", "TERM")]
AT = os.environ.get("LAB_SIGNAL_AT", "training")
calls = {"n": 0}


def _fire() -> None:
    calls["n"] += 1
    if calls["n"] == (3 if AT == "training" else 1):
        os.kill(os.getpid(), SIGNUM)


def _patch(cls, name: str) -> None:
    original = getattr(cls, name)

    def patched(self, *args, **kwargs):
        _fire()
        return original(self, *args, **kwargs)

    setattr(cls, name, patched)


_patch(MAPCore, "training_step") if AT == "training" else _patch(Laplace, "fit_batch")

if __name__ == "__main__":
    train_mod.main()
