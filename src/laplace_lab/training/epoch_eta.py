"""``EpochETA``: the remaining training time, estimated after every epoch.

A hook object with Lightning's hook names, run by the plain loop as it is and by Lightning as
``training.lightning_classes.EpochETACallback``. After each epoch (validation included) it
estimates the time left as (epochs left) x (mean epoch time of this launch: a resumed run counts
only the epochs it ran itself), writes it to the run's ``progress.json`` (``laplace_lab.io.eta``)
and logs it after the first epoch, then at most every ``log_every_s`` seconds (and a closing line
after the last):

    MAP training: epoch 1/20, 58 s per epoch; about 18 min 22 s left (ends ~14:32)

``progress.json`` is rewritten after the first and the last epoch, and in between at most every
``write_every_s`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from laplace_lab.io.eta import ProgressFile, clock_time, format_duration

log = logging.getLogger(__name__)


class EpochETA:
    """Args:
        folder: where ``progress.json`` goes (None: log only).
        label: the phase's name in the log lines (``MAP training``, ``ensemble member 2/5``, ...).
        log_every_s: the shortest time between two log lines after the first epoch.
        write_every_s: the shortest time between two writes of ``progress.json``.
        clock: seconds (monotonic); tests pass a fake one.
    """

    def __init__(self, folder: str | Path | None, label: str = "MAP training", log_every_s: float = 60.0,
                 write_every_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.progress = ProgressFile(folder) if folder is not None else None
        self.label, self.clock = label, clock
        self.log_every_s, self.write_every_s = float(log_every_s), float(write_every_s)
        self.started: float | None = None
        self.first_epoch = 0
        self.last_log: float | None = None
        self.last_write: float | None = None

    def on_fit_start(self, trainer, module) -> None:
        if self.progress is not None:
            self.progress.update(phase="MAP training", label=self.label, epoch=int(trainer.current_epoch),
                                 max_epochs=int(trainer.max_epochs), eta_s=None)

    def on_train_epoch_start(self, trainer, module) -> None:
        if self.started is None:
            self.started, self.first_epoch = self.clock(), int(trainer.current_epoch)

    def estimate(self, epochs_done: int, max_epochs: int) -> tuple[float, float]:
        """(mean seconds per epoch of this launch, seconds left) after ``epochs_done`` epochs."""
        ran = max(epochs_done - self.first_epoch, 1)
        per_epoch = (self.clock() - self.started) / ran
        return per_epoch, per_epoch * max(max_epochs - epochs_done, 0)

    def on_train_epoch_end(self, trainer, module) -> None:
        if self.started is None:  # a hook order without an epoch start (never in either loop)
            return
        done, total = int(trainer.current_epoch) + 1, int(trainer.max_epochs)
        per_epoch, left = self.estimate(done, total)
        now = self.clock()
        last = done >= total
        if self.progress is not None and (self.last_write is None or now - self.last_write >= self.write_every_s or last):
            self.last_write = now
            self.progress.update(epoch=done, max_epochs=total, epoch_s=per_epoch, eta_s=left)
        if last:
            log.info("%s: epoch %d/%d, %s per epoch; done", self.label, done, total, format_duration(per_epoch))
        elif self.last_log is None or now - self.last_log >= self.log_every_s:
            self.last_log = now
            ends = f" (ends ~{clock_time(time.time() + left)})" if left >= 60 else ""
            log.info("%s: epoch %d/%d, %s per epoch; about %s left%s", self.label, done, total,
                     format_duration(per_epoch), format_duration(left), ends)
