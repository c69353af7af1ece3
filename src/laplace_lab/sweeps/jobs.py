"""``run_tracked``: what ``laplace_lab.train.main`` runs for each job.

Single runs (``python -m laplace_lab.train``) always run and raise on error. Jobs of a multirun
(``-m``) are resumable: a job whose folder already holds a finished run of the same config
(``config_hash`` in ``status.json``) is skipped with a log line; one finished with another config
(a preset edited since: the folder name does not change) runs again with a warning naming both
hashes. A job that runs has its ``status.json`` marked ``running``, then ``finished``, or ``failed``
with the traceback, and a failure is logged but not raised, so the other jobs go on and the
``SweepSummary`` callback reports it at the end. The return value is the sweep objective
(``val/nll`` unless ``+sweep_objective=<metric>``), NaN for a failed job: what Optuna minimises.
Every run logs its output folder when it starts and ends; a job's marker also holds its launch id,
``started_unix`` / ``ended_unix`` and its ``devices`` (``record_devices``, called by ``train.run``
once the trainer and model exist).

A relaunch sets aside what an earlier attempt left unreadable (``status.set_aside_unreadable``)
and its wandb runs (``superseded``). SIGTERM / SIGINT (``signals.JobInterrupted``) mark the job
``failed`` with ``interrupted`` and stop the launch; in a launcher's worker process (submitit, Ray)
the handlers are installed here and the worker then exits with 128 + the signal number. An explicit ``checkpoint.dirpath`` is narrowed
per job in a multirun (``job_checkpoint_dir``, applied by ``train.run``), so the jobs cannot share
checkpoints.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.io.wandb_offline import sync_hint
from laplace_lab.sweeps import signals
from laplace_lab.sweeps.devices import device_record
from laplace_lab.sweeps.ranks import is_first_process
from laplace_lab.sweeps.run_only import job_dirname
from laplace_lab.sweeps.signals import JobInterrupted
from laplace_lab.sweeps.status import (
    ENTRY,
    STATUS_FILE,
    config_fingerprint,
    git_state,
    hardware,
    is_finished,
    job_launch_id,
    now_iso,
    read_metrics,
    read_status,
    record_immutable_skip,
    set_aside_unreadable,
    unchanged_config,
    write_status,
)
from laplace_lab.sweeps.superseded import set_aside_earlier_runs

log = logging.getLogger(__name__)
FAILED_FILE = "FAILED"  # the traceback of the last failed attempt (removed when the job is re-run)
DEFAULT_OBJECTIVE = "val/nll"


def objective_key(cfg: Any) -> str:
    """``sweep_objective`` of the job config (a mapping), else ``DEFAULT_OBJECTIVE``."""
    return str(cfg.get("sweep_objective") or DEFAULT_OBJECTIVE)


def objective(metrics: dict[str, float] | None, key: str) -> float:
    """``metrics[key]`` as a float; NaN when the job failed or did not log it."""
    if not metrics or key not in metrics:
        return math.nan
    return float(metrics[key])


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


RunFn = Callable[[Any, Path], dict[str, float]]


def record_devices(output_dir: Path, trainer=None, module=None) -> dict:
    """Write the run's devices (``devices.device_record``) into its ``status.json`` and log them."""
    record = device_record(trainer, module)
    write_status(output_dir, devices=record)
    log.info("Devices: %s", ", ".join(f"{k}={v}" for k, v in record.items()))
    return record


def run_tracked(run_fn: RunFn, cfg: Any, output_dir: Path) -> float:
    """Run ``run_fn(cfg, output_dir)`` (skipping finished multirun jobs); return the objective. ``cfg``
    is the composed job config (a mapping), handed to ``run_fn`` as it is and hashed here.

    The output folder is logged when the run starts and when it ends (finished, skipped or failed),
    and last its offline W&B run with the command that uploads it (``io.wandb_offline``), if any."""
    log.info("Output folder: %s", output_dir.resolve())
    signals.install_in_worker()  # a launcher's worker: SIGTERM marks the job, not submitit's bypass
    try:
        return _run_tracked(run_fn, cfg, output_dir)
    except JobInterrupted as err:
        if signals.in_worker():  # (marked interrupted below) the worker ends, non-zero, and says why
            log.error("Stopped by %s (exit status %d)", err.signal_name, err.exit_code)
            raise SystemExit(err.exit_code) from None
        raise
    finally:
        log.info("Run ended; its outputs are in %s", output_dir.resolve())
        hint = sync_hint(output_dir)
        if hint:
            log.info(hint)


def _mark_interrupted(output_dir: Path, err: JobInterrupted, start: float | None = None) -> None:
    """``status.json``: state ``failed``, ``interrupted``: the signal's name (a relaunch runs the job again)."""
    wall = {} if start is None else {"wall_s": time.perf_counter() - start}
    write_status(output_dir, state="failed", interrupted=err.signal_name, ended=now_iso(), ended_unix=time.time(),
                 error=f"JobInterrupted: {err}", traceback=None, **wall)
    log.error("Run in %s interrupted by %s: marked failed in %s", output_dir, err.signal_name, output_dir / STATUS_FILE)


def record_skip(output_dir: Path, launch_id: str | None, sweep_dir: Path | None = None) -> None:
    """Stamp a skipped finished job's ``status.json`` with this launch; a folder that cannot be written
    (read-only or immutable: a protected finished result) is logged and the job stays skipped, its
    metrics still read, instead of aborting the relaunch. The skip is then noted in the sweep folder
    (``sweep_dir``: ``status.record_immutable_skip``), so the summary counts it as ``skipped_immutable``."""
    try:
        write_status(output_dir, last_launch_id=launch_id, last_action="skipped", skipped_at=now_iso())
    except OSError as err:
        log.warning("Skipped finished job in %s, but could not record the skip in its %s (%s: %s); its "
                    "results are used as they are", output_dir, STATUS_FILE, type(err).__name__, err)
        if sweep_dir is None:
            return
        job, sweep = Path(output_dir).resolve(), Path(sweep_dir).resolve()
        name = str(job.relative_to(sweep)) if job.is_relative_to(sweep) else job.name
        try:
            record_immutable_skip(sweep_dir, launch_id, name, f"{type(err).__name__}: {err}")
        except OSError as again:
            log.warning("Could not note the skip of %s in %s either (%s: %s): the summary will not count it",
                        name, sweep_dir, type(again).__name__, again)


def job_checkpoint_dir(dirpath: str, output_dir: Path, output_root: str | None) -> str:
    """A multirun job's own folder under an explicit ``checkpoint.dirpath``: ``<dirpath>/<the job's
    folder relative to paths.output_root>`` (experiment, sweep folder and job names; else the last
    three parts of the job's folder), so the jobs neither overwrite nor resume each other's checkpoints."""
    job = Path(output_dir).resolve()
    root = Path(output_root).resolve() if output_root else None
    rel = job.relative_to(root) if root is not None and job.is_relative_to(root) else Path(*job.parts[-3:])
    return str(Path(dirpath) / rel)


def _run_tracked(run_fn: RunFn, cfg: Any, output_dir: Path) -> float:
    key = objective_key(cfg)
    if not is_multirun():
        try:
            return objective(run_fn(cfg, output_dir), key)
        except JobInterrupted as err:
            if is_first_process():
                _mark_interrupted(output_dir, err)
            raise
    hc = HydraConfig.get()
    name = job_dirname(hc.overrides.task)
    launch_id = job_launch_id(hc)
    output_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = config_fingerprint(cfg)
    finished = is_finished(output_dir)
    old_hash = (read_status(output_dir) or {}).get("config_hash", fingerprint)  # none: a marker from before hashes
    if not is_first_process():  # a DDP rank > 0 (e.g. a SLURM task): it trains when rank 0 does; rank 0 keeps the records
        if finished and unchanged_config(old_hash, cfg):
            return objective(read_metrics(output_dir), key)
        return objective(run_fn(cfg, output_dir), key)
    if finished and not unchanged_config(old_hash, cfg):
        log.warning("Job #%s %s finished before with a different config (hash %s, now %s): running it again",
                    hc.job.num, name, old_hash, fingerprint)
        (output_dir / "metrics.json").unlink()
    elif finished:
        log.info("Skipping job #%s %s: already finished in %s", hc.job.num, name, output_dir)
        record_skip(output_dir, launch_id, Path(hc.sweep.dir))
        return objective(read_metrics(output_dir), key)
    set_aside_unreadable(output_dir)  # a cut-off status.json / metrics.json: named, kept aside, run again
    set_aside_earlier_runs(output_dir)
    overrides = list(hc.overrides.task)
    previous = write_status(output_dir, state="running", launch_id=launch_id, last_launch_id=launch_id,
                            last_action="ran", started=now_iso(), started_unix=time.time(), ended=None,
                            ended_unix=None, error=None, traceback=None, devices=device_record())
    write_status(output_dir, attempts=int(previous.get("attempts") or 0) + 1, job_num=hc.job.num,
                 overrides=overrides, command=" ".join([ENTRY, *map(shlex.quote, overrides)]),
                 git=git_state(), pid=os.getpid(), host=socket.gethostname(), config_hash=fingerprint)
    (output_dir / FAILED_FILE).unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        metrics = run_fn(cfg, output_dir)
    except JobInterrupted as err:  # SIGTERM / SIGINT: mark it, then stop the sweep (sweeps.signals)
        _mark_interrupted(output_dir, err, start)
        raise
    except Exception as err:  # noqa: BLE001 - a failing job must not stop the others
        write_status(output_dir, state="failed", ended=now_iso(), ended_unix=time.time(), wall_s=time.perf_counter() - start,
                     error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(), hardware=hardware())
        write_text_atomic(output_dir / FAILED_FILE, traceback.format_exc())
        log.error("Job #%s %s FAILED (%s: %s); traceback in %s", hc.job.num, name,
                  type(err).__name__, err, output_dir / "status.json")
        return math.nan
    write_status(output_dir, state="finished", ended=now_iso(), ended_unix=time.time(), wall_s=time.perf_counter() - start,
                 hardware=hardware())
    return objective(metrics, key)
