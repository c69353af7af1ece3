"""A hand-made toy2d-preset sweep folder for the dashboard tests: four finished jobs (data.kind x
seed) with real figures drawn by ``evaluation.plots``, one failed job, and the end of the multirun
run by the ``SweepSummary`` callback (table, verdicts, dashboard) as a launch does."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from omegaconf import OmegaConf

from laplace_lab.evaluation import plots
from laplace_lab.reporting import tables
from laplace_lab.reporting.sweep_table import SweepTable, validate_aggregate
from laplace_lab.sweeps.callback import SweepSummary

PRESET = "toy2d"
KINDS, SEEDS = ("linear", "moons"), (0, 1)


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    return buf.getvalue()


def draw_figures() -> dict[str, bytes]:
    """A reliability diagram and confidence histograms (MAP blue, Laplace orange) as PNG bytes."""
    rng = np.random.default_rng(0)
    centers = (np.arange(10) + 0.5) / 10
    bins = pd.concat([pd.DataFrame({"predictor": p, "bin_center": centers, "accuracy": centers ** k,
                                    "confidence": centers, "count": np.full(10, 20)}) for p, k in (("map", 2), ("la", 1))])
    conf = pd.concat([pd.DataFrame({"predictor": p, "dataset": d, "confidence": rng.uniform(lo, 1, 200)})
                      for p in ("map", "la") for d, lo in (("test", 0.7), ("far_away", 0.5))])
    return {"reliability": png(plots.reliability_diagram(bins, {"map": 0.1, "la": 0.05}, "reliability")),
            "confidence_hist": png(plots.confidence_histograms(conf, "max confidence", n_classes=2))}


def make_job(sweep: Path, kind: str, seed: int, metrics: dict[str, float] | None, figures: dict[str, bytes],
             state: str = "finished") -> Path:
    overrides = [f"data.kind={kind}", f"seed={seed}", "trainer.max_epochs=1"]
    job = sweep / ",".join(overrides)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    choices = {"experiment": PRESET, "data": "toy2d", "method": "kron"}
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))
    (job / "config_resolved.yaml").write_text(yaml.safe_dump({"seed": seed, "method_name": "kron",
                                                              "data": {"kind": kind}}))
    (job / "figures").mkdir()
    for name, data in figures.items():
        (job / "figures" / f"{name}.png").write_bytes(data)
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))
    status = {"state": state, "launch_id": "L1", "last_action": "ran", "wall_s": 1.0,
              "git": {"commit": "abc1234", "dirty": False, "ignored_checked": True}}
    if state == "failed":
        status["error"] = "RuntimeError: boom"
    (job / "status.json").write_text(json.dumps(status))
    return job


def make_sweep(sweep: Path, figures: dict[str, bytes], aggregate: bool = True) -> Path:
    """The sweep folder, ended by the callback (with the preset's ``aggregate`` block when
    ``aggregate``: table and verdicts); every metric of that block is logged by every job."""
    spec = {k: v for k, v in tables.preset_spec(PRESET).items() if k != "figures"}
    for i, (kind, seed) in enumerate((k, s) for k in KINDS for s in SEEDS):
        metrics = {m: 0.5 + 0.01 * i + 0.001 * j for j, m in enumerate(spec["metrics"])}
        make_job(sweep, kind, seed, {**metrics, "val/nll": 0.3}, figures)
    make_job(sweep, "moons", 2, None, {}, state="failed")
    (sweep / "launches.jsonl").write_text(json.dumps({"launch_id": "L1", "command": "python -m laplace_lab.train "
                                                      f"experiment={PRESET}"}) + "\n")
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}, "runtime": {"choices": {"experiment": PRESET}}}})
    callback = SweepSummary(fail_on_error=False, aggregator=SweepTable())
    callback.aggregate = validate_aggregate(spec) if aggregate else None
    callback.on_multirun_end(cfg)
    return sweep
