"""``SweepETA``: a multirun's jobs done out of its total, and the time it has left.

Configured in ``conf/train.yaml`` as ``hydra.callbacks.sweep_eta``. At the start it counts the
launch's jobs (``count_jobs``: the basic sweeper's grid, Optuna's ``n_trials``) and logs the
total; after every job it logs one line:

    Sweep: 3/15 jobs done (1 skipped as finished before, 0 failed); 2 min 10 s per job run; about 26 min left (ends ~13:05)

The time per job is the mean wall time of the jobs this launch ran (skipped ones take no time),
so the estimate assumes the remaining jobs cost as much as those. With launchers that run the
jobs in other processes (Ray, submitit) the jobs end there, so the lines come from each job's own
log (``training.epoch_eta``) instead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from laplace_lab.io.eta import clock_time, format_duration
from laplace_lab.sweeps.status import read_status

log = logging.getLogger(__name__)


def count_jobs(config: DictConfig) -> int | None:
    """Jobs of the launch: the product of the basic sweeper's swept values (its ``params`` and the
    command line's overrides, the latter winning), Optuna's ``n_trials``; None for other sweepers."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    if target.endswith("BasicSweeper"):
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
        overrides = [f"{k}={v}" for k, v in params.items()]
        overrides += list(OmegaConf.select(config, "hydra.overrides.task", default=None) or [])
        try:
            parsed = OverridesParser.create().parse_overrides(overrides)
            return sum(len(batch) for batch in BasicSweeper.split_arguments(parsed, None))
        except Exception:  # noqa: BLE001 - a sweep the parser cannot count: no total, no ETA
            return None
    n_trials = OmegaConf.select(config, "hydra.sweeper.n_trials", default=None)
    return int(n_trials) if n_trials is not None else None


class SweepETA(Callback):
    def __init__(self) -> None:
        self.total: int | None = None
        self.started: float | None = None
        self.job_started: float | None = None
        self.ran_s: list[float] = []
        self.done = self.skipped = self.failed = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.total, self.started = count_jobs(config), time.monotonic()
        if self.total is not None:
            log.info("Sweep: %d jobs; the time left is logged after each job", self.total)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.job_started = time.monotonic()

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if self.started is None or self.job_started is None:  # a job in another process (Ray, submitit)
            return
        seconds = time.monotonic() - self.job_started
        status = read_status(Path(config.hydra.runtime.output_dir)) or {}
        self.done += 1
        if status.get("last_action") == "skipped":
            self.skipped += 1
        else:
            self.ran_s.append(seconds)
            self.failed += status.get("state") == "failed"
        log.info("%s", self.line())

    def line(self, now_unix: float | None = None) -> str:
        """``Sweep: 3/15 jobs done (...); 2 min 10 s per job run; about 26 min left (ends ~13:05)``."""
        total = "?" if self.total is None else str(self.total)
        text = f"Sweep: {self.done}/{total} jobs done ({self.skipped} skipped as finished before, {self.failed} failed)"
        if self.total is None or not self.ran_s or self.done >= self.total:
            return text
        per_job = sum(self.ran_s) / len(self.ran_s)
        left = per_job * (self.total - self.done)
        ends = clock_time((time.time() if now_unix is None else now_unix) + left)
        return f"{text}; {format_duration(per_job)} per job run; about {format_duration(left)} left (ends ~{ends})"
