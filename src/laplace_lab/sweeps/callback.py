"""``SweepSummary``: the Hydra callback that closes a multirun with a summary.

Configured in ``conf/train.yaml`` as ``hydra.callbacks.sweep_summary``:

- ``fail_on_error`` (default true): exit with status 1 after the summary when a job failed or
  did not finish, or the aggregation failed.
- ``aggregate`` (default null): ``{name, metrics, group_by, seed_keys, results_dir, figures,
  model_selection}``, handed to the ``aggregator`` to write ``<name>.md``, ``.csv`` and ``.jobs.csv``
  of this launch's jobs into the sweep folder (``results_dir``, when given, relative to it).
  When null, a root-level ``aggregate`` key of the config (set by an experiment preset) is used.
  Invalid keys stop the multirun before any job runs.
- ``aggregator``: an object with ``validate(aggregate) -> dict | None``, ``write(sweep_dir, spec,
  launch_id, preset) -> [paths]`` and ``dashboard(sweep_dir) -> path`` (``conf/train.yaml`` gives
  ``laplace_lab.reporting.sweep_table.SweepTable`` by ``_target_``, so this package does not import
  reporting); None: an ``aggregate`` is an error, and no dashboard is written.

- ``lock_wait_s`` (default 0): how long a launch waits for another launch holding the same sweep
  folder before it refuses (``sweeps.lock``).

- ``fail_on_error`` must be a bool and ``lock_wait_s`` a finite number >= 0: else the launch stops
  before any job runs.

At the start it names the sweep folder (``<output_root>/<experiment_name>/multirun`` for a preset's
own sweep, ``.../multirun_<the command's overrides>`` when the command adds overrides, with the
sweeper first when the command chooses one other than ``basic``: ``multirun_map_grid_<overrides>``;
run-only keys left out, see ``sweeps.run_only.sweep_dirname``; an explicit ``hydra.sweep.dir=`` is kept),
locks it (a second launch into it refuses, naming the holder), appends the launch to
``<sweep dir>/launches.jsonl`` and hands its launch id to every job through
``hydra.job.env_set.LAPLACE_LAB_LAUNCH_ID``. At the end it collects this launch's jobs from their
``status.json`` markers (finished / skipped / failed / unfinished), logs them, writes
``<sweep dir>/summary.json``, the table (``aggregate``) and the sweep's self-contained
``dashboard.html`` (``aggregator.dashboard``; its path in the summary), and releases the lock. A launch stopped by SIGTERM / SIGINT
(``sweeps.signals``) still writes its summary (``interrupted``: the signal), without a table.
A single run (no ``-m``) locks its run folder instead (``on_run_start``): a second run into the
same ``hydra.run.dir`` is refused before Hydra writes anything there.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from laplace_lab.sweeps import children, lock, signals
from laplace_lab.sweeps.ranks import is_first_process
from laplace_lab.sweeps.run_only import sweep_dirname, sweeper_choice
from laplace_lab.sweeps.status import (
    LAUNCH_ENV,
    STATUS_FILE,
    SUMMARY_FILE,
    immutable_skips,
    last_launch_id,
    new_launch,
    now_iso,
    read_launches,
    read_status,
    record_launch,
    write_json_atomic,
)

log = logging.getLogger(__name__)
def summarize(sweep_dir: str | Path, launch_id: str | None) -> dict[str, Any]:
    """Classify the jobs of launch ``launch_id`` under ``sweep_dir`` by their markers: the jobs it
    ran or skipped (``status.last_launch_id``). A finished job skipped in a folder that could not be
    written (``jobs.record_skip``) counts as skipped and is named in ``skipped_immutable`` too."""
    sweep_dir = Path(sweep_dir)
    jobs: dict[str, list] = {"finished": [], "skipped": [], "failed": [], "unfinished": []}
    for path in sorted(sweep_dir.rglob(STATUS_FILE)):
        status = read_status(path.parent)
        if not status or last_launch_id(status) != launch_id:
            continue
        name = str(path.parent.relative_to(sweep_dir))
        if status.get("last_action") == "skipped":
            jobs["skipped"].append(name)
        elif status.get("state") == "finished":
            jobs["finished"].append(name)
        elif status.get("state") == "failed":
            jobs["failed"].append({"job": name, "error": status.get("error"), "status": str(path)})
        else:
            jobs["unfinished"].append(name)
    # skipped finished jobs whose folders could not be stamped (read-only, chattr +i): noted in the sweep folder
    listed = {j if isinstance(j, str) else j["job"] for v in jobs.values() for j in v}
    immutable = immutable_skips(sweep_dir, launch_id)
    jobs["skipped"] += [name for name in immutable if name not in listed]
    counts = {k: len(v) for k, v in jobs.items()}
    return {"sweep_dir": str(sweep_dir), "launch_id": launch_id, "counts": counts, **jobs,
            "skipped_immutable": immutable}


def _quote(value: str) -> str:
    """``value`` as a quoted Hydra override value (in quotes only a quote needs its backslash)."""
    return "'" + value.replace("'", "\\'") + "'"


def name_sweep_dir(config: DictConfig) -> Path:
    """Set ``hydra.sweep.dir`` of this launch to its own folder (``run_only.sweep_dirname`` of the
    command's overrides and its ``hydra/sweeper`` choice) unless the command or a config set it; returns it."""
    sweep_dir = Path(config.hydra.sweep.dir)
    hydra_overrides = OmegaConf.select(config, "hydra.overrides.hydra", default=None) or []
    explicit = any(str(o).lstrip("+").startswith("hydra.sweep.dir=") for o in hydra_overrides)
    if not explicit and sweep_dir.name == "multirun":
        task = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
        sweep_dir = sweep_dir.parent / sweep_dirname(task, sweeper_choice(hydra_overrides))
        _add_hydra_override(config, "hydra.sweep.dir", str(sweep_dir))
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.sweep.dir = str(sweep_dir)
    return sweep_dir


def _add_hydra_override(config: DictConfig, key: str, text: str) -> None:
    """Append the Hydra override ``key='text'`` that every job's config (composed from these
    overrides) gets. Quoted, so the jobs read ``text`` as text: unquoted, Hydra's parser reads a hex
    launch id such as ``7966e6773611`` as a float (inf) and ``123456789012`` as an int."""
    with read_write(config.hydra), open_dict(config.hydra):
        if OmegaConf.select(config, "hydra.overrides.hydra") is None:  # a config not composed by Hydra (tests)
            config.hydra.overrides = {"hydra": [], "task": []}
        config.hydra.overrides.hydra.append(f"{key}={_quote(text)}")


OPTION = "hydra.callbacks.sweep_summary"


def check_options(fail_on_error: Any, lock_wait_s: Any) -> float:
    """``fail_on_error`` a bool and ``lock_wait_s`` a finite number of seconds >= 0 (``nan`` would
    wait forever); returns ``lock_wait_s`` as a float. ValueError naming the option otherwise."""
    if not isinstance(fail_on_error, bool):
        raise ValueError(f"{OPTION}.fail_on_error={fail_on_error!r} must be true or false")
    ok = isinstance(lock_wait_s, (int, float)) and not isinstance(lock_wait_s, bool)
    if not (ok and math.isfinite(lock_wait_s) and lock_wait_s >= 0):
        raise ValueError(f"{OPTION}.lock_wait_s={lock_wait_s!r} is not allowed; allowed: a finite number of "
                         "seconds >= 0 (0: refuse at once when another launch holds the sweep folder)")
    return float(lock_wait_s)


class SweepSummary(Callback):
    def __init__(self, fail_on_error: bool = True, aggregate: Any = None, lock_wait_s: float = 0.0,
                 aggregator: Any = None) -> None:
        try:
            self.lock_wait_s = check_options(fail_on_error, lock_wait_s)
        except ValueError as err:  # Hydra turns callback errors into warnings; stop before any job runs
            log.error("%s", err)
            raise SystemExit(1) from err
        self.fail_on_error = fail_on_error
        self.aggregator = aggregator
        self.aggregate = self._validate(aggregate)
        self.launch: dict[str, Any] | None = None
        self.lock_fd: int | None = None
        self.config: DictConfig | None = None
        self.run_lock_fd: int | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A single run: lock its folder (``hydra.run.dir``) before Hydra writes into it, so a second
        run into the same folder is refused instead of mixing their files (``sweeps.lock``)."""
        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        if not is_first_process():  # a DDP rank > 0 in the folder of rank 0, which holds the lock
            return
        try:
            self.run_lock_fd = lock.acquire(run_dir, {**new_launch(), "pid": os.getpid()}, what="run folder",
                                            advice=lock.RUN_ADVICE)
        except lock.SweepLocked as err:
            log.error("%s", err)
            raise SystemExit(1) from err

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        lock.release(self.run_lock_fd)
        self.run_lock_fd = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            root = OmegaConf.select(config, "aggregate")
            self.aggregate = self.aggregate or self._validate(None if root is None else OmegaConf.to_container(root, resolve=True))
        except ValueError as err:
            # Hydra turns exceptions raised by callbacks into warnings; stop before any job runs.
            log.error("%s", err)
            raise SystemExit(1) from err
        sweep_dir = name_sweep_dir(config)
        launch = new_launch()
        try:
            self.lock_fd = lock.acquire(sweep_dir, {**launch, "pid": os.getpid()}, wait_s=self.lock_wait_s)
        except lock.SweepLocked as err:
            log.error("%s", err)
            raise SystemExit(1) from err
        self.launch = record_launch(sweep_dir, launch)
        _add_hydra_override(config, f"++hydra.job.env_set.{LAUNCH_ENV}", launch["launch_id"])
        log.info("Sweep folder: %s (launch %s)", sweep_dir.resolve(), launch["launch_id"])
        self.config = config
        signals.on_interrupt(self._on_interrupt)  # SIGTERM / SIGINT: the summary is still written

    def _validate(self, aggregate: Any) -> dict[str, Any] | None:
        """``aggregate`` checked by the aggregator (a ValueError for bad keys, or for no aggregator)."""
        if aggregate is None:
            return None
        if self.aggregator is None:
            raise ValueError("aggregate is set but the sweep_summary callback has no aggregator "
                             "(hydra.callbacks.sweep_summary.aggregator)")
        return self.aggregator.validate(aggregate)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        signals.remove(self._on_interrupt)
        try:
            self._summarize(config)
        finally:
            lock.release(self.lock_fd)
            self.lock_fd = None

    def _on_interrupt(self, err: signals.JobInterrupted) -> None:
        """The launch was stopped by a signal: the signal goes to the worker processes it started and
        they are waited for (``children``), then its summary (no table), then the lock is released."""
        try:
            children.stop_descendants(err.signum)
            self._summarize(self.config, interrupted=err)
        finally:
            lock.release(self.lock_fd)
            self.lock_fd = None

    def _summarize(self, config: DictConfig, interrupted: signals.JobInterrupted | None = None) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        launch = self.launch or (read_launches(sweep_dir) or [{}])[-1]
        summary = summarize(sweep_dir, launch.get("launch_id"))
        summary.update(command=launch.get("command"), started=launch.get("started"), ended=now_iso())
        if interrupted is not None:
            summary["interrupted"] = interrupted.signal_name
            log.error("Multirun %s stopped by %s: the jobs it had not run yet were not started; run the same "
                      "command again to run them", sweep_dir, interrupted.signal_name)
        c = summary["counts"]
        log.info("Multirun summary (%s): %d finished, %d skipped (already finished; %d of them in folders that "
                 "cannot be written), %d failed, %d unfinished", sweep_dir, c["finished"], c["skipped"],
                 len(summary["skipped_immutable"]), c["failed"], c["unfinished"])
        for failure in summary["failed"]:
            log.error("  FAILED %s: %s (traceback: %s)", failure["job"], failure["error"], failure["status"])
        for name in summary["unfinished"]:
            log.warning("  UNFINISHED %s (no end marker: killed?)", name)
        write_json_atomic(sweep_dir / SUMMARY_FILE, summary)
        log.info("Summary written to %s", sweep_dir / SUMMARY_FILE)
        if interrupted is not None:  # (the entry point exits with 128 + the signal number)
            return
        aggregation_failed = False
        if self.aggregate:
            try:  # this launch's jobs, into the sweep folder; verdicts of the preset's reference.yaml
                paths = self.aggregator.write(sweep_dir, self.aggregate, launch.get("launch_id"),
                                              OmegaConf.select(config, "hydra.runtime.choices.experiment"))
            except Exception as err:  # noqa: BLE001 - reported, then the exit status says so
                log.error("Aggregation of %s failed: %s: %s", sweep_dir, type(err).__name__, err)
                aggregation_failed = True
            else:
                summary["results"] = [str(p) for p in paths]
                write_json_atomic(sweep_dir / SUMMARY_FILE, summary)
                log.info("Aggregated %s into %s", sweep_dir, ", ".join(map(str, paths)))
        dashboard_failed = self._dashboard(sweep_dir, summary)
        if self.fail_on_error and (summary["failed"] or summary["unfinished"] or aggregation_failed
                                   or dashboard_failed):
            # Hydra turns exceptions raised by callbacks into warnings; SystemExit gets through.
            if summary["failed"] or summary["unfinished"]:
                log.error("%d failed and %d unfinished job(s) in %s; re-run the same command to run only those.",
                          c["failed"], c["unfinished"], sweep_dir)
            if aggregation_failed:
                log.error("The jobs' results are in their folders, but the table of %s was not written (the "
                          "aggregation error above); fix it, then run python -m laplace_lab.reporting.tables on the folder.",
                          sweep_dir)
            raise SystemExit(1)

    def _dashboard(self, sweep_dir: Path, summary: dict[str, Any]) -> bool:
        """Write the sweep's ``dashboard.html`` (by the aggregator) and name it in the summary and
        the log; True when that failed (logged, with the command that rebuilds it)."""
        if self.aggregator is None:
            return False
        try:
            page = Path(self.aggregator.dashboard(sweep_dir))
        except Exception as err:  # noqa: BLE001 - reported, then the exit status says so
            log.error("Dashboard of %s failed: %s: %s; rebuild it with python -m laplace_lab.reporting.dashboard %s",
                      sweep_dir, type(err).__name__, err, sweep_dir)
            return True
        summary["dashboard"] = str(page)
        write_json_atomic(sweep_dir / SUMMARY_FILE, summary)
        log.info("Dashboard: %s (open it in a browser; no server or network needed)", page.resolve().as_uri())
        return False
