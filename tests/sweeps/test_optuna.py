"""The Optuna preset for MAP baselines: it minimises the val/nll that train.main returns."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.sweeps.helpers import TINY, multirun, require_plugin, summary


@pytest.mark.slow  # ~12 s: three trials in a subprocess
def test_map_optuna_minimises_validation_nll(tmp_path):
    require_plugin("hydra_plugins.hydra_optuna_sweeper")
    proc, sweep = multirun(tmp_path, "hydra/sweeper=map_optuna", "hydra.sweeper.n_trials=3", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = [sweep / j for j in summary(sweep)["finished"]]
    assert len(jobs) == 3
    nll = [json.loads((d / "metrics.json").read_text())["val/nll"] for d in jobs]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert abs(best["best_value"] - min(nll)) < 1e-9
    assert set(best["best_params"]) == {"optimizer.lr", "prior.prior_precision"}
    for d in jobs:  # the prior is the weight decay: it is searched, weight_decay stays 0
        cfg = yaml.safe_load((d / "config_resolved.yaml").read_text())
        assert cfg["optimizer"]["weight_decay"] == 0 and 1e-4 <= cfg["prior"]["prior_precision"] <= 1e3
