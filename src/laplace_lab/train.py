"""Hydra entry point: ``python -m laplace_lab.train [overrides]`` (alias ``laplace-lab-train``).

The one module that sees the composed ``DictConfig``: it is checked and read into the typed
``RunConfig`` (``config.load``) before any data is loaded, and everything below gets typed objects.
A run: train the MAP network (``training.fit``, or ``training.map_grid`` for a grid of prior
precisions), fit the post-hoc Laplace (``training.posthoc``), the ensemble's other members
(``training.ensemble``), evaluate (``evaluation``), and write into the run directory
``config_resolved.yaml``, ``metrics.json``, ``csv/metrics.csv`` and (offline) ``wandb/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from laplace_lab.config import CONF_DIR
from laplace_lab.config.instantiate import CONFIG_ERRORS, config_phase
from laplace_lab.config.load import load_run_config
from laplace_lab.config.schema import RunConfig
from laplace_lab.config.targets import guard_hydra_config
from laplace_lab.evaluation.summary import laplace_summary
from laplace_lab.io import quiet_logs
from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.io.eta import PhaseLog
from laplace_lab.reporting.run_loggers import build_loggers, finish_loggers, swept_values
from laplace_lab.sweeps.devices import check_accelerator
from laplace_lab.sweeps.jobs import is_multirun, job_checkpoint_dir, record_devices, run_tracked
from laplace_lab.sweeps.ray_launch import patch_ray_launcher
from laplace_lab.sweeps.signals import exit_on_interrupt
from laplace_lab.training import ensemble, loop_choice
from laplace_lab.training.eval_plan import evaluation_plan
from laplace_lab.training.fit import train_map, training_plan
from laplace_lab.training.map_grid import train_map_grid
from laplace_lab.training.posthoc import fit_posthoc_laplace
from laplace_lab.training.underfit import train_target_std, warn_if_underfit

log = logging.getLogger(__name__)
quiet_logs.install()  # third-party tips and known-harmless warnings, before Hydra composes the config
guard_hydra_config()  # the hydra node (callbacks, logging, launcher, sweeper) is checked as Hydra composes it
patch_ray_launcher()  # a SIGTERM / SIGINT stops a Ray launch like any other (sweeps.ray_launch)


class NonFiniteMetricsError(RuntimeError):
    """The run finished but some final metrics are nan / inf: it is marked failed, not finished."""


def run(cfg: DictConfig, output_dir: Path) -> dict[str, float]:
    """Validate, build, train and evaluate one run; returns the final metrics."""
    narrow_checkpoint_dir(cfg, output_dir)
    with config_phase():  # bad input: the message alone, before any data is loaded
        job = load_run_config(cfg)
        check_accelerator(job.trainer.accelerator, job.trainer.devices)
        check_ddp_launch(job, is_multirun())
        loop = loop_choice.choose_loop(job)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    set_cpu_modes(job)
    if job.ensemble.enabled and job.ensemble.member is not None:  # train one member into the MAP cache
        return ensemble.run_member_job(job, output_dir, train_map)
    loggers = build_loggers(job, output_dir, plain=not loop.lightning)
    phases = PhaseLog(output_dir)
    phases.start("MAP training", training_plan(job, loop))
    train = train_map_grid if job.map_grid else train_map
    datamodule, module, trainer, metrics = train(job, output_dir, loggers, loop)
    if getattr(trainer, "world_size", 1) > 1 and trainer.global_rank != 0:
        # DDP: every rank holds the same network and hyperparameters; rank 0 alone fits the post-hoc
        # Laplace, evaluates on the full test set and writes metrics.json
        log.info("DDP rank %d of %d: training done; rank 0 evaluates", trainer.global_rank, trainer.world_size)
        return metrics
    # the loops' teardown moved it to the CPU: fit the Laplace where it trained
    module.to(loop.root_device(trainer))
    record_devices(output_dir, trainer, module)
    if module.likelihood == "regression":
        metrics["hparams/sigma_noise"] = module.sigma_noise.item()
    la = None
    if job.needs_posthoc_laplace:
        c = job.curvature
        phases.start("Laplace fit", f"{c.subset_of_weights} {c.hessian_structure} {c.type}, one pass over the "
                     f"{datamodule.n_train} training rows, then the prior by {job.marglik.posthoc_prior}")
        la, la_metrics = fit_posthoc_laplace(job, module, datamodule)
        metrics.update(la_metrics)
    extra_predictors = None
    if job.ensemble.enabled:  # members 1..K-1 and the mixtures (member 0 is the network above)
        phases.start("Ensemble members", f"{job.ensemble.size - 1} more networks, each trained like the first")
        extra_predictors, ensemble_metrics = ensemble.fit_members(job, output_dir, module, la, train_map)
        metrics.update(ensemble_metrics)
    for logger in loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
    if job.evaluation.enabled:
        phases.start("Evaluation", "an estimate of its time follows the test-set pass")
        start = time.perf_counter()
        from laplace_lab.evaluation.runner import (
            run_evaluation,  # pandas and matplotlib load when a run evaluates
        )

        plan = evaluation_plan(job, module, datamodule, la, output_dir, extra_predictors, swept_values())
        metrics.update(run_evaluation(plan, loggers, step=trainer.global_step, on_eta=phases.eta))
        log.info("Evaluation: %d metrics, %.1f s", len(metrics), time.perf_counter() - start)
        if module.likelihood != "classification":
            warn_if_underfit(metrics, train_target_std(datamodule))
    finish_loggers(loggers)
    write_text_atomic(output_dir / "metrics.json", json.dumps(metrics, indent=2))
    print_final_metrics(metrics, output_dir / "metrics.json", is_multirun())
    summary = laplace_summary(metrics, job.raw, module.likelihood, job.evaluation.ood.far_away_alpha)
    if summary:  # what the Laplace predictive changed against the MAP
        print(summary)
    phases.finish()
    check_final_metrics(metrics, output_dir / "metrics.json")
    return metrics


def print_final_metrics(metrics: dict[str, float], path: Path, multirun: bool) -> None:
    """A single run prints its headline metrics (test/, time/, hparams/, laplace/); a multirun job one
    line naming its metrics.json (a sweep's log stays readable: the table holds every job's values)."""
    if multirun:
        print(f"Final metrics: {len(metrics)} values in {path}")
        return
    headline = {k: v for k, v in metrics.items() if k.startswith(("test/", "time/", "hparams/", "laplace/"))}
    print("Final metrics:\n" + "\n".join(f"  {k}: {v:.4f}" for k, v in headline.items()))


def check_ddp_launch(job: RunConfig, multirun: bool) -> None:
    """``trainer=ddp`` with more than one process inside a multirun needs SLURM tasks (submitit, one
    task per device): Lightning's own start of the other ranks repeats the command line, ``-m`` and
    the whole sweep included."""
    t = job.trainer
    one_process = t.devices in (1, [0]) and t.num_nodes == 1
    if t.strategy == "ddp" and multirun and not one_process and int(os.environ.get("SLURM_NTASKS") or 1) <= 1:
        raise ValueError(f"trainer=ddp with trainer.devices={t.devices!r} in a multirun needs one SLURM task per device "
                         "(hydra/launcher=submitit_slurm with hydra.launcher.tasks_per_node = trainer.devices); "
                         "allowed here: one run per command (hydra.mode=RUN), or trainer.devices=1 (docs/gpu.md)")


def narrow_checkpoint_dir(cfg: DictConfig, output_dir: Path) -> None:
    """A multirun job's explicit ``checkpoint.dirpath`` becomes its own folder under it
    (``sweeps.jobs.job_checkpoint_dir``), so the jobs neither overwrite nor resume each other's checkpoints."""
    dirpath = OmegaConf.select(cfg, "checkpoint.dirpath")
    if not dirpath or not is_multirun():
        return
    narrowed = job_checkpoint_dir(str(dirpath), output_dir, OmegaConf.select(cfg, "paths.output_root"))
    with read_write(cfg), open_dict(cfg):
        cfg.checkpoint.dirpath = narrowed
    log.info("checkpoint.dirpath=%s is shared by the jobs of this multirun: this job's checkpoints go to %s",
             dirpath, narrowed)


def set_cpu_modes(job: RunConfig) -> None:
    """Apply ``torch_num_threads`` (null: torch's default) and ``flush_denormal`` (subnormal floats
    read and written as zero; a warning where the CPU cannot)."""
    if job.torch_num_threads:
        torch.set_num_threads(int(job.torch_num_threads))
    if not torch.set_flush_denormal(bool(job.flush_denormal)) and job.flush_denormal:
        log.warning("flush_denormal=true is not supported on this CPU: subnormal floats are kept")


def check_final_metrics(metrics: dict[str, float], path: Path) -> None:
    """Raise ``NonFiniteMetricsError`` naming every non-finite metric (already saved in ``path``)."""
    bad = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not math.isfinite(v)}
    if bad:
        raise NonFiniteMetricsError(f"{len(bad)} final metrics are not finite: {bad}; the run counts as failed "
                                    f"(all metrics are kept in {path})")


@exit_on_interrupt
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float:
    """One run; in a multirun, skips finished jobs and records failures (``laplace_lab.sweeps``).
    SIGTERM / SIGINT mark the job failed and exit 128 + the signal number (``sweeps.signals``).

    Returns the sweep objective (``val/nll``), which the Optuna sweeper minimises.
    """
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        return run_tracked(run, cfg, Path(HydraConfig.get().runtime.output_dir))
    except CONFIG_ERRORS as err:
        if not getattr(err, "config_error", False) or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"Config error: {err}\n(HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
        sys.exit(1)
    finally:
        _teardown_wandb_in_ray_worker()


def _teardown_wandb_in_ray_worker() -> None:
    """In a Ray worker, shut wandb's service down while it is still alive: its exit hook otherwise
    runs after Ray has stopped the service and prints a ``ConnectionResetError`` traceback per job."""
    launcher = str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default="") or "")
    if "ray" in launcher.lower() and "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


if __name__ == "__main__":
    main()
