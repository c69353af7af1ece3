"""Multiruns as a user launches them: resumable layout, failures, the summary, Ray and submitit."""

from __future__ import annotations

import json
import logging
import math
import statistics

import pytest
import yaml
from omegaconf import OmegaConf

from laplace_lab.sweeps.resolvers import job_subdir
from laplace_lab.sweeps.run_only import is_run_only
from laplace_lab.sweeps.status import (
    config_fingerprint,
    earlier_fingerprint,
    is_finished,
    read_status,
    unchanged_config,
)
from tests.conftest import compose_config
from tests.sweeps.helpers import TINY, multirun, require_plugin, summary


def test_sweep_layout_is_stable():
    from laplace_lab.config import CONF_DIR

    hydra = yaml.safe_load((CONF_DIR / "train.yaml").read_text())["hydra"]
    assert hydra["sweep"]["dir"] == "${paths.output_root}/${experiment_name}/multirun"
    assert hydra["sweep"]["subdir"] == "${lab_job_subdir:${hydra:overrides.task}}"
    # one run-only list (sweeps.run_only), no second one in Hydra's override_dirname.exclude_keys
    assert "config" not in hydra["job"]
    assert all(is_run_only(k) for k in ("hydra/launcher", "paths.output_root", "logger", "experiment"))
    assert "now:" in hydra["run"]["dir"]  # single runs keep their timestamped folder
    assert compose_config(["experiment_name=exp"]).experiment_name == "exp"
    assert job_subdir(["seed=1", "optimizer.lr=0.1"]) == "optimizer.lr=0.1,seed=1"
    assert job_subdir([]) == "default" and "/" not in job_subdir(["data=a/b"])


@pytest.mark.slow  # several multiruns (10-25 s); make test-slow runs it
def test_failed_job_is_reported_and_rerun_runs_only_unfinished(tmp_path):
    # optimizer.lr=-1 makes torch.optim.Adam raise inside that job only.
    args = [*TINY, "seed=0", "optimizer.lr=1e-3,1e-2,-1"]
    proc, sweep = multirun(tmp_path, *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    s = summary(sweep)
    assert s["counts"] == {"finished": 2, "skipped": 0, "failed": 1, "unfinished": 0}
    (failed,) = s["failed"]
    assert "optimizer.lr=-1" in failed["job"] and "learning rate" in failed["error"]
    bad = sweep / failed["job"]
    assert read_status(bad)["state"] == "failed" and "Traceback" in (bad / "FAILED").read_text()
    good = [sweep / j for j in s["finished"]]
    assert all(is_finished(d) for d in good)
    assert all(math.isfinite(json.loads((d / "metrics.json").read_text())["val/nll"]) for d in good)

    # A killed job leaves state "running": make the lr=1e-2 job look killed, then re-run the same command.
    killed = next(d for d in good if "optimizer.lr=0.01" in d.name)
    kept = next(d for d in good if d != killed)
    (killed / "metrics.json").unlink()
    status = json.loads((killed / "status.json").read_text())
    (killed / "status.json").write_text(json.dumps({**status, "state": "running"}))
    kept_mtime = (kept / "metrics.json").stat().st_mtime_ns

    proc, sweep = multirun(tmp_path, *args)
    assert proc.returncode == 1
    s = summary(sweep)
    assert s["skipped"] == [kept.name] and s["finished"] == [killed.name], (s, proc.stdout[-4000:], proc.stderr[-4000:])
    assert s["failed"][0]["job"] == bad.name
    assert (kept / "metrics.json").stat().st_mtime_ns == kept_mtime
    assert read_status(bad)["attempts"] == 2 and read_status(kept)["attempts"] == 1
    assert "Skipping job" in proc.stdout + proc.stderr
    assert len((sweep / "launches.jsonl").read_text().splitlines()) == 2
    assert read_status(kept)["config_hash"] != read_status(killed)["config_hash"]

    # A finished job whose config changed since (an edited preset keeps the folder name) runs again.
    status = read_status(kept)
    (kept / "status.json").write_text(json.dumps({**status, "config_hash": "0" * 16}))
    proc, sweep = multirun(tmp_path, *args)
    s = summary(sweep)
    assert kept.name in s["finished"] and killed.name in s["skipped"], (s, proc.stderr[-3000:])
    assert "finished before with a different config" in proc.stdout + proc.stderr
    assert read_status(kept)["config_hash"] == status["config_hash"] and is_finished(kept)


def test_config_fingerprint_ignores_run_only_keys():
    cfg = compose_config(["seed=0"])
    base = config_fingerprint(cfg)
    assert config_fingerprint(compose_config(["seed=0", "paths.output_root=/elsewhere", "torch_num_threads=3",
                                              "trainer.enable_progress_bar=false"])) == base
    assert config_fingerprint(compose_config(["seed=1"])) != base
    assert config_fingerprint(compose_config(["seed=0", "trainer.max_epochs=7"])) != base


@pytest.mark.slow  # Ray start-up: 20-35 s alone, timed out (300 s) on the overloaded 2-core machine
def test_ray_two_parallel_cpu_jobs_and_aggregation(tmp_path):
    require_plugin("hydra_plugins.hydra_ray_launcher")
    proc, sweep = multirun(tmp_path, "hydra/launcher=ray", *TINY, "seed=0,1",
                           "+aggregate={name:ray_tiny,metrics:[val/nll],results_dir:tables}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sweep / "tables"  # (results_dir: a folder below the sweep folder)
    assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
    s = summary(sweep)
    assert s["counts"]["finished"] == 2 and s["counts"]["failed"] == 0
    jobs = [sweep / j for j in s["finished"]]
    pids = {read_status(d)["pid"] for d in jobs}
    assert len(pids) == 2  # each job in its own Ray worker process
    values = [json.loads((d / "metrics.json").read_text())["val/nll"] for d in jobs]
    assert values[0] != values[1]  # different seeds
    rows = [line for line in (results / "ray_tiny.csv").read_text().splitlines() if not line.startswith("#")]
    header, (row,) = rows[0].split(","), rows[1:]
    cells = dict(zip(header, row.replace('"seed=0, seed=1"', "seeds").split(",")))
    assert int(cells["n"]) == 2
    assert abs(float(cells["val/nll mean"]) - statistics.mean(values)) < 1e-12
    assert abs(float(cells["val/nll se"]) - statistics.stdev(values) / math.sqrt(2)) < 1e-12
    md = (results / "ray_tiny.md").read_text()
    assert "hydra/launcher=ray" in md and "seed: 0, 1" in md


SCHEMA_WARNING = r"ignore:\s*'hydra/\w+/\w+' is validated against ConfigStore schema"


@pytest.mark.filterwarnings(SCHEMA_WARNING)
def test_sweeper_presets_compose():
    from hydra import compose, initialize_config_dir

    from laplace_lab.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        grid = compose("train", ["hydra/sweeper=map_grid"], return_hydra_config=True).hydra.sweeper
        assert grid._target_.endswith("BasicSweeper") and "seed" in grid.params
        require_plugin("hydra_plugins.hydra_optuna_sweeper")
        optuna = compose("train", ["hydra/sweeper=map_optuna"], return_hydra_config=True).hydra.sweeper
    assert optuna.direction == "minimize" and set(optuna.params) == {"optimizer.lr", "prior.prior_precision"}


@pytest.mark.slow  # several multiruns (10-25 s); make test-slow runs it
@pytest.mark.filterwarnings(SCHEMA_WARNING)
def test_submitit_configs_compose_and_local_runs_a_job(tmp_path):
    require_plugin("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir

    from laplace_lab.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        slurm = compose("train", ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"],
                        return_hydra_config=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and slurm.partition == "gpu"
    assert slurm.gpus_per_node == 1 and slurm.timeout_min > 0 and slurm.array_parallelism > 0

    proc, sweep = multirun(tmp_path, "hydra/launcher=submitit_local", *TINY, "seed=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = summary(sweep)["finished"]
    assert job == "data=toy2d,evaluation=none,seed=3,trainer=debug" and is_finished(sweep / job)
    assert read_status(sweep / job)["pid"] and (sweep / ".submitit").is_dir()


def test_aggregation_leaves_out_metrics_no_job_of_the_launch_has(tmp_path):
    # A preset may list metrics of runs this launch does not have (e.g. the OOD set of the other data
    # set in a one-set launch): the end-of-multirun table leaves them out, names them, and exits 0.
    proc, sweep = multirun(tmp_path, *TINY, "seed=0",
                           "+aggregate={name:tiny,metrics:[val/nll,ood/absent/auroc],results_dir:tables}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sweep / "tables"
    md = (results / "tiny.md").read_text()
    assert "## Metrics left out (in no run's metrics.json)\n\n`ood/absent/auroc`" in md
    assert "| val/nll |" in md and "ood/absent/auroc |" not in md


def test_failed_aggregation_exits_1_and_says_the_jobs_are_fine(tmp_path, monkeypatch, caplog):
    import laplace_lab.reporting.tables
    from laplace_lab.reporting.sweep_table import SweepTable
    from laplace_lab.sweeps.callback import SweepSummary

    def broken(*args, **kwargs):
        raise RuntimeError("broken table")

    monkeypatch.setattr(laplace_lab.reporting.tables, "aggregate_sweep", broken)
    (tmp_path / "sweep").mkdir()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    callback = SweepSummary(aggregate={"name": "t"}, aggregator=SweepTable())
    with pytest.raises(SystemExit) as exit_info, caplog.at_level(logging.ERROR):
        callback.on_multirun_end(config)
    assert exit_info.value.code == 1
    assert "Aggregation of" in caplog.text and "RuntimeError: broken table" in caplog.text
    assert "the table of" in caplog.text and "was not written" in caplog.text
    assert "failed and" not in caplog.text  # no job failed: not the re-run message


def test_a_switched_off_feature_stays_out_of_the_config_hash():
    """``evaluation.landscape`` counts only when enabled: adding a feature that is off does not make
    finished jobs run again (``run_only.SWITCHED_OFF``); its options count once it is on."""
    base = compose_config(["seed=0"])
    assert config_fingerprint(compose_config(["seed=0", "evaluation.landscape.grid_points=5"])) == config_fingerprint(base)
    on = compose_config(["seed=0", "evaluation.landscape.enabled=true"])
    assert config_fingerprint(on) != config_fingerprint(base)
    assert config_fingerprint(compose_config(["seed=0", "evaluation.landscape.enabled=true",
                                              "evaluation.landscape.grid_points=5"])) != config_fingerprint(on)


def test_a_job_hashed_before_switched_off_nodes_left_the_hash_is_unchanged():
    """A finished job's ``config_hash`` written while switched-off nodes were still hashed (the
    landscape node with ``enabled: false``) counts as unchanged, so a relaunch skips it; another config's
    hash in either form does not."""
    cfg = compose_config(["seed=0"])
    earlier = earlier_fingerprint(cfg)
    assert earlier != config_fingerprint(cfg)  # the landscape node, off, is hashed in the earlier form only
    assert unchanged_config(earlier, cfg) and unchanged_config(config_fingerprint(cfg), cfg)
    other = compose_config(["seed=1"])
    assert not unchanged_config(earlier_fingerprint(other), cfg) and not unchanged_config(config_fingerprint(other), cfg)
    assert not unchanged_config("0" * 16, cfg)
    before = OmegaConf.to_container(cfg, resolve=True)  # a job from before het_head and het_approx existed
    del before["het_head"], before["predictive"]["het_approx"]
    assert config_fingerprint(before) == config_fingerprint(cfg)
    assert config_fingerprint(compose_config(["seed=0", "predictive.het_approx=natural"])) != config_fingerprint(cfg)
