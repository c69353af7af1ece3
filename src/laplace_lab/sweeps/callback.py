"""``SweepSummary``: the Hydra callback that closes a multirun with a summary.

Configured in ``conf/train.yaml`` as ``hydra.callbacks.sweep_summary``:

- ``fail_on_error`` (default true): exit with status 1 after the summary when a job failed or
  did not finish, or the aggregation failed.
- ``aggregate`` (default null): ``{name, metrics, group_by, seed_keys, results_dir, figures,
  model_selection}``,
  passed to ``laplace_lab.tables.aggregate_sweep`` to write ``<name>.md``, ``.csv`` and ``.jobs.csv``
  of this launch's jobs into the sweep folder (``results_dir``, when given, relative to it).
  When null, a root-level ``aggregate`` key of the config (set by an experiment preset) is used.
  Invalid keys stop the multirun before any job runs.

At the start it appends the launch to ``<sweep dir>/launches.jsonl``; at the end it collects this
launch's jobs from their ``status.json`` markers (finished / skipped / failed / unfinished), logs
them and writes ``<sweep dir>/summary.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from laplace_lab.model_selection import validate_spec
from laplace_lab.sweeps.status import (
    STATUS_FILE,
    SUMMARY_FILE,
    now_iso,
    read_launches,
    read_status,
    record_launch,
    write_json_atomic,
)

log = logging.getLogger(__name__)
AGGREGATE_KEYS = ("name", "metrics", "group_by", "seed_keys", "results_dir", "figures", "model_selection")


def validate_aggregate(aggregate: Any) -> dict[str, Any] | None:
    """The ``aggregate`` option as a plain dict (or None); unknown keys raise a ValueError."""
    if aggregate is None:
        return None
    spec = OmegaConf.to_container(aggregate, resolve=True) if isinstance(aggregate, DictConfig) else dict(aggregate)
    unknown = sorted(set(spec) - set(AGGREGATE_KEYS))
    if unknown:
        raise ValueError(f"aggregate has unknown keys {unknown}; "
                         f"allowed: {list(AGGREGATE_KEYS)}")
    if not spec.get("name"):
        raise ValueError("aggregate.name is required (the results/<name>.md table)")
    if spec.get("model_selection") is not None:
        validate_spec(spec["model_selection"])
    return spec


def summarize(sweep_dir: str | Path, launch_id: str | None) -> dict[str, Any]:
    """Classify the jobs of launch ``launch_id`` under ``sweep_dir`` by their markers."""
    sweep_dir = Path(sweep_dir)
    jobs: dict[str, list] = {"finished": [], "skipped": [], "failed": [], "unfinished": []}
    for path in sorted(sweep_dir.rglob(STATUS_FILE)):
        status = read_status(path.parent)
        if not status or status.get("launch_id") != launch_id:
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
    counts = {k: len(v) for k, v in jobs.items()}
    return {"sweep_dir": str(sweep_dir), "launch_id": launch_id, "counts": counts, **jobs}


class SweepSummary(Callback):
    def __init__(self, fail_on_error: bool = True, aggregate: Any = None) -> None:
        self.fail_on_error = bool(fail_on_error)
        self.aggregate = validate_aggregate(aggregate)
        self.launch: dict[str, Any] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.aggregate = self.aggregate or validate_aggregate(OmegaConf.select(config, "aggregate"))
        except ValueError as err:
            # Hydra turns exceptions raised by callbacks into warnings; stop before any job runs.
            log.error("%s", err)
            raise SystemExit(1) from err
        self.launch = record_launch(config.hydra.sweep.dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        launch = self.launch or (read_launches(sweep_dir) or [{}])[-1]
        summary = summarize(sweep_dir, launch.get("launch_id"))
        summary.update(command=launch.get("command"), started=launch.get("started"), ended=now_iso())
        c = summary["counts"]
        log.info("Multirun summary (%s): %d finished, %d skipped (already finished), %d failed, %d unfinished",
                 sweep_dir, c["finished"], c["skipped"], c["failed"], c["unfinished"])
        for failure in summary["failed"]:
            log.error("  FAILED %s: %s (traceback: %s)", failure["job"], failure["error"], failure["status"])
        for name in summary["unfinished"]:
            log.warning("  UNFINISHED %s (no end marker: killed?)", name)
        write_json_atomic(sweep_dir / SUMMARY_FILE, summary)
        log.info("Summary written to %s", sweep_dir / SUMMARY_FILE)
        aggregation_failed = False
        if self.aggregate:
            from laplace_lab.tables import aggregate_sweep

            try:  # this launch's jobs, into the sweep folder; verdicts of the preset's reference.yaml
                paths = aggregate_sweep(sweep_dir, self.aggregate, launch_id=launch.get("launch_id"),
                                        preset=OmegaConf.select(config, "hydra.runtime.choices.experiment"))
            except Exception as err:  # noqa: BLE001 - reported, then the exit status says so
                log.error("Aggregation of %s failed: %s: %s", sweep_dir, type(err).__name__, err)
                aggregation_failed = True
            else:
                summary["results"] = [str(p) for p in paths]
                write_json_atomic(sweep_dir / SUMMARY_FILE, summary)
                log.info("Aggregated %s into %s", sweep_dir, ", ".join(map(str, paths)))
        if self.fail_on_error and (summary["failed"] or summary["unfinished"] or aggregation_failed):
            # Hydra turns exceptions raised by callbacks into warnings; SystemExit gets through.
            log.error("%d failed and %d unfinished job(s) in %s; re-run the same command to run only those.",
                      c["failed"], c["unfinished"], sweep_dir)
            raise SystemExit(1)
