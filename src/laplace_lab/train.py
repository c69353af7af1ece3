"""Hydra entry point: ``python -m laplace_lab.train [overrides]`` (alias ``laplace-lab-train``).

Composes data, model, optimiser, trainer and loggers from ``conf/``, trains a MAP network with
PyTorch Lightning or, for small in-memory runs, the plain loop (``trainer.loop``,
``training.loop_choice``; Lightning is then never imported), evaluates it on the test set, and
writes into the run directory:
``config_resolved.yaml``, ``metrics.json``, ``csv/metrics.csv`` and (offline) ``wandb/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from laplace_lab import quiet_logs
from laplace_lab.config_validation import HELD_OUT_VALIDATION, validate_config
from laplace_lab.data.base import LabDataModule
from laplace_lab.data.split_checks import check_nonempty
from laplace_lab.eta import PhaseLog, attached_to_terminal
from laplace_lab.evaluation.config import check_landscape_run
from laplace_lab.evaluation.config import validate_config as validate_evaluation_config
from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.run_loggers import build_loggers, finish_loggers
from laplace_lab.safe_targets import check_targets, guard_hydra_callbacks
from laplace_lab.sweeps.devices import check_accelerator
from laplace_lab.sweeps.jobs import record_devices, run_tracked
from laplace_lab.sweeps.signals import exit_on_interrupt
from laplace_lab.training import ensemble, loop_choice, map_cache
from laplace_lab.training.epoch_eta import EpochETA
from laplace_lab.training.module import MAPCore
from laplace_lab.training.online_marglik import OnlineMarglikCore
from laplace_lab.training.plain_loop import PlainTrainer, resolve_device, seed_everything
from laplace_lab.training.posthoc import fit_posthoc_laplace, laplace_kwargs, needs_posthoc_laplace
from laplace_lab.training.predictors import (
    het_approx_alternatives,
    laplace_predictor,
    map_predictor,
)
from laplace_lab.training.resume import (
    check_resume,
    checkpoint_dir,
    resume_path,
    run_fingerprint,
    run_identity,
    validate_checkpoint_config,
)

log = logging.getLogger(__name__)
quiet_logs.install()  # third-party tips and known-harmless warnings, before Hydra composes the config
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_ERRORS = (ValueError, FileNotFoundError)  # what validation and our constructors raise on bad input
guard_hydra_callbacks()  # hydra.callbacks.* targets are checked against the allowlist before Hydra builds them


@contextmanager
def config_phase():
    """Mark ``ValueError`` / ``FileNotFoundError`` raised inside as bad input (``err.config_error``):
    ``main`` then prints the message alone instead of a traceback (``HYDRA_FULL_ERROR=1``: the traceback)."""
    try:
        yield
    except CONFIG_ERRORS as err:
        err.config_error = True
        raise


def instantiate(node, *args, **kwargs):
    """``hydra.utils.instantiate`` that re-raises our own errors unwrapped.

    Hydra wraps constructor errors in ``InstantiationException``; the original
    ``ValueError`` / ``FileNotFoundError`` names the option and the allowed values, so show it.
    """
    try:
        return hydra.utils.instantiate(node, *args, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, CONFIG_ERRORS):
            err.__cause__.config_error = True
            raise err.__cause__ from None
        raise


def resolve_likelihood(cfg: DictConfig, datamodule: LabDataModule) -> str:
    """``likelihood: auto`` follows the data module's task; an explicit value must fit it."""
    if cfg.likelihood == "auto":
        return datamodule.task
    expected = "classification" if cfg.likelihood == "classification" else "regression"
    if datamodule.task != expected:
        raise ValueError(f"likelihood={cfg.likelihood!r} does not fit a {datamodule.task} dataset")
    return cfg.likelihood


def _uses_augmentation(cfg: DictConfig) -> bool:
    """An ``augmentation`` group other than mode ``none`` (its module imports Lightning)."""
    aug = cfg.get("augmentation")
    return aug is not None and aug.get("mode") != "none"


def build(cfg: DictConfig, loop: str = "lightning") -> tuple[LabDataModule, MAPCore]:
    """Instantiate the data module and the training module (no training yet): a ``MAPModule``
    (LightningModule) for ``loop="lightning"``, a ``MAPCore`` for the plain loop. Every ``_target_`` of
    ``cfg`` is checked against the allowlist first (``safe_targets``): callers rebuild jobs from
    their ``config_resolved.yaml`` through here."""
    check_targets(cfg)
    if loop == "lightning":  # imported before the data module, which is then a LightningDataModule (data.base)
        from laplace_lab.training.module import MAPModule as module_class
    else:
        module_class = MAPCore
    datamodule: LabDataModule = instantiate(cfg.data)
    likelihood = resolve_likelihood(cfg, datamodule)
    n_out = datamodule.num_outputs * (2 if likelihood == "heteroscedastic_regression" else 1)
    model = instantiate(cfg.model)(input_shape=datamodule.input_shape, num_outputs=n_out)
    if likelihood == "heteroscedastic_regression":  # het_head: the link of the noise precision
        from laplace_lab.models.het_head import with_het_head

        model = with_het_head(model, cfg.get("het_head", "softplus"))
    dtype = getattr(datamodule, "dtype", torch.float32)
    if dtype != torch.float32:  # data.dtype=float64: the network computes in the data's precision
        model = model.to(dtype)
    if _uses_augmentation(cfg):  # augmentation/: logits averaged over transforms
        from laplace_lab.training.augmentation import wrap_model

        model = wrap_model(cfg.get("augmentation"), model)
    scheduler = instantiate(cfg.lr_scheduler) if cfg.get("lr_scheduler") else None
    module = module_class(
        model=model,
        likelihood=likelihood,
        n_data=datamodule.n_train,
        optimizer=instantiate(cfg.optimizer),
        lr_scheduler=scheduler,
        prior_precision=cfg.prior.prior_precision,
        sigma_noise=cfg.sigma_noise,
        temperature=cfg.temperature,
        prior_in_loss=cfg.prior_in_map_loss,
        on_nonfinite_loss=cfg.on_nonfinite_loss,
        loss_scale=cfg.map_loss_scale,
    )
    check_nonempty(datamodule, f"data {cfg.data.get('_target_')}")  # set up by n_train above; before any training
    return datamodule, module


def build_callbacks(cfg: DictConfig, output_dir: Path, loop: str = "lightning") -> list:
    """Online marglik (``marglik=online``) and checkpointing (``checkpoint.enabled``); Lightning
    callbacks for ``loop="lightning"``, the plain loop's hook objects otherwise."""
    callbacks: list = []
    if cfg.marglik.mode == "online":
        m = cfg.marglik
        if loop == "lightning":
            from laplace_lab.training.online_marglik import OnlineMarglik as marglik_class
        else:
            marglik_class = OnlineMarglikCore
        callbacks.append(marglik_class(
            laplace_kwargs(cfg.curvature), prior_structure=cfg.prior.structure, frequency=m.frequency,
            n_steps=m.n_steps, burnin=m.burnin, lr_hyp=m.lr_hyp, lr_hyp_min=m.lr_hyp_min,
            optimize_sigma=m.optimize_sigma, early_stopping=m.early_stopping, log_min=m.log_min,
            log_max=m.log_max, fit_batch_size=cfg.curvature.get("fit_batch_size"), fused=m.fused,
        ))
    aug = cfg.get("augmentation")
    # after OnlineMarglik: the eta step uses the new prior; mode none + report: eta = 0 and the marglik in metrics
    if aug is not None and (aug.mode != "none" or (aug.get("report") and cfg.marglik.mode == "online")):
        from laplace_lab.training.augmentation import AugmentationMarglik

        callbacks.append(AugmentationMarglik(
            aug.mode == "learned", cfg.curvature.hessian_structure, cfg.curvature.type, cfg.marglik.get("frequency", 1),
            cfg.marglik.get("burnin", 0), aug.get("lr", 0.05), aug.get("lr_min", 0.05), cfg.curvature.get("fit_batch_size"),
            cfg.curvature.subset_of_weights == "all",
        ))
    if cfg.checkpoint.enabled:  # last.ckpt, plus the best by checkpoint.monitor if set
        callbacks += checkpoint_callbacks(cfg, output_dir)
    callbacks.append(epoch_eta(output_dir, loop))
    return callbacks


def epoch_eta(output_dir: Path, loop: str = "lightning"):
    """The remaining-training-time hook (``training.epoch_eta``) of the training in ``output_dir``
    (a ``map_grid`` point, its refit or an ensemble member is named by its subfolder)."""
    name = output_dir.name
    label = f"MAP training ({name})" if name.startswith(("grid_", "member_", REFIT_NAME)) else "MAP training"
    if loop == "lightning":
        from laplace_lab.training.lightning_classes import EpochETACallback as eta_class
    else:
        eta_class = EpochETA
    return eta_class(output_dir, label)


def checkpoint_callbacks(cfg: DictConfig, output_dir: Path) -> list:
    """``last.ckpt`` rewritten every ``checkpoint.every_n_epochs`` epochs, and with
    ``checkpoint.monitor`` the best checkpoint by it (``best-epoch<N>.ckpt``). Two callbacks:
    Lightning's own ``save_last`` (2.6) rewrites last.ckpt only in an epoch that also saved a
    top-k checkpoint, i.e. never without a monitor (only at the end of training) and only on
    improvement with one, which would leave a cut-off run nothing recent to resume."""
    import pytorch_lightning as pl

    dirpath, every = str(checkpoint_dir(cfg, output_dir)), cfg.checkpoint.every_n_epochs
    callbacks = [pl.callbacks.ModelCheckpoint(dirpath=dirpath, filename="last", every_n_epochs=every, save_top_k=1,
                                              monitor=None, enable_version_counter=False)]
    if cfg.checkpoint.get("monitor"):
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=dirpath, every_n_epochs=every, save_top_k=1, monitor=cfg.checkpoint.monitor,
            mode=cfg.checkpoint.get("mode", "min"), filename="best-epoch{epoch}", auto_insert_metric_name=False))
    return callbacks


def evaluate(cfg: DictConfig, module: MAPCore, datamodule: LabDataModule, la, loggers, output_dir: Path,
             step: int, extra_predictors: dict | None = None, on_eta=None) -> dict[str, float]:
    """MAP and (if fitted) Laplace predictives side by side, through ``laplace_lab.evaluation``;
    ``extra_predictors`` (e.g. the ensemble's ``de`` / ``mola``) are evaluated beside them. FGSM
    attacks ``module.model`` (for an ensemble: member 0). Progress bars only on a terminal;
    ``on_eta(seconds)`` receives the evaluation's estimate of its remaining time."""
    predictors = {"map": map_predictor(module)}
    if la is not None:
        predictors["la"] = laplace_predictor(la, cfg.predictive)
        predictors.update(het_approx_alternatives(la, cfg.predictive))
    predictors.update(extra_predictors or {})
    task = "classification" if module.likelihood == "classification" else "regression"
    is_toy2d = task == "classification" and tuple(datamodule.input_shape) == (2,)
    # imported here: pandas and matplotlib load when a run evaluates
    from laplace_lab.evaluation.landscape import LandscapeInputs
    from laplace_lab.evaluation.runner import run_evaluation

    landscape = None  # the loss landscape around the MAP beside la's Gaussian (evaluation.landscape)
    if la is not None and OmegaConf.select(cfg, "evaluation.landscape.enabled", default=False):
        landscape = LandscapeInputs(la, datamodule.train_set, datamodule.test_set)

    eval_cfg = cfg.evaluation
    if eval_cfg.get("progress") and not attached_to_terminal():  # one line per section instead
        eval_cfg = OmegaConf.merge(eval_cfg, {"progress": False})
    return run_evaluation(
        eval_cfg, task, predictors, datamodule.test_dataloader(), ood_loaders=datamodule.ood_dataloaders(),
        attack_model=module.model, out_dir=output_dir, logger=loggers,
        target_mean=datamodule.target_mean if datamodule.target_mean is not None else 0.0,
        target_std=datamodule.target_std if datamodule.target_std is not None else 1.0,
        dataset=getattr(datamodule, "name", None), data_dir=cfg.paths.data_dir,
        input_range=datamodule.input_range, toy_data=datamodule.train_set.tensors if is_toy2d else None,
        step=step, landscape=landscape, on_eta=on_eta, label=run_label(cfg, module.likelihood),
    )


def run_label(cfg: DictConfig, likelihood: str) -> str:
    """``toy2d moons; Laplace: last-layer KFAC-GGN, GLM predictive (MC)``: written on every figure."""
    from laplace_lab.evaluation.labels import dataset_label, laplace_label

    bayes = f"; Laplace: {laplace_label(cfg, likelihood)}" if needs_posthoc_laplace(cfg) else ""
    return f"{dataset_label(cfg.data)}{bayes}"


def make_trainer(cfg: DictConfig, output_dir: Path, loggers, callbacks, loop: str):
    """Lightning's ``Trainer`` (``cfg.trainer`` but ``loop``) or the plain loop's ``PlainTrainer``."""
    if loop == "plain":
        t = cfg.trainer
        return PlainTrainer(t.max_epochs, resolve_device(t.get("accelerator", "auto")), loggers, callbacks,
                            log_every_n_steps=t.get("log_every_n_steps", 50),
                            enable_progress_bar=t.get("enable_progress_bar", True) and attached_to_terminal(),
                            check_val_every_n_epoch=t.get("check_val_every_n_epoch", 1))
    import pytorch_lightning as pl

    kwargs = loop_choice.trainer_kwargs(cfg)  # progress bars only on a terminal: epoch lines (EpochETA) otherwise
    kwargs["enable_progress_bar"] = kwargs.get("enable_progress_bar", True) and attached_to_terminal()
    return pl.Trainer(**kwargs, logger=loggers, default_root_dir=str(output_dir),
                      callbacks=callbacks, enable_checkpointing=cfg.checkpoint.enabled)


def set_cpu_modes(cfg) -> None:
    """Apply ``torch_num_threads`` (null: torch's default) and ``flush_denormal`` (subnormal floats
    read and written as zero; a warning where the CPU cannot)."""
    if cfg.torch_num_threads:
        torch.set_num_threads(int(cfg.torch_num_threads))
    if not torch.set_flush_denormal(bool(cfg.flush_denormal)) and cfg.flush_denormal:
        log.warning("flush_denormal=true is not supported on this CPU: subnormal floats are kept")


def train_map(cfg: DictConfig, output_dir: Path, loggers, loop: str | None = None) -> tuple[LabDataModule, MAPCore, object, dict]:
    """Seed, build and train (or load from the MAP cache) one network with ``loop`` (``lightning`` |
    ``plain``; None: ``trainer.loop``'s choice); returns its final metrics ``time/fit_s`` and
    ``val/nll`` (the last validation NLL, the objective of sweeps)."""
    loop = loop or loop_choice.choose_loop(cfg)
    if loop == "lightning":
        import pytorch_lightning as pl

        pl.seed_everything(cfg.seed, workers=True)
    else:
        seed_everything(cfg.seed)
    resume = resume_path(cfg, output_dir)
    if resume:
        check_resume(cfg, resume)
    datamodule, module = build(cfg, loop)
    module.run_identity = run_identity(cfg)
    if cfg.checkpoint.enabled:
        module.run_fingerprint = run_fingerprint(cfg)
    callbacks = build_callbacks(cfg, output_dir, loop)
    trainer = make_trainer(cfg, output_dir, loggers, callbacks, loop)
    start = time.perf_counter()
    cached = map_cache.cache_path(cfg, datamodule)
    if map_cache.load(module, cached):
        datamodule.setup("fit")
        metrics = {"time/fit_s": 0.0, "map_cache/hit": 1.0}
    else:
        module.fit_clock_start = start
        if loop == "plain":  # (a run resuming from a checkpoint is never plain: loop_choice)
            trainer.fit(module, datamodule)
        else:
            # (check_resume read the checkpoint with weights_only=True already; Lightning reads it the same way)
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
        map_cache.save(module, cached, map_cache.key_contents(cfg, datamodule) if cached else None)
        # with a resumed checkpoint: the earlier launches' training time up to it, plus this launch's
        metrics = {"time/fit_s": module.fit_seconds()}
        if resume:
            metrics["checkpoint/resumed_fit_s"] = module.fit_seconds_before
    if "val/nll" in trainer.callback_metrics:
        metrics["val/nll"] = float(trainer.callback_metrics["val/nll"])
    for cb in callbacks:  # final augmentation ranges (AugmentationMarglik)
        metrics.update(getattr(cb, "final_metrics", dict)())
    metrics.update(guard_counts(module, trainer))
    log.info("MAP training: %s, %d epochs, %d steps, %.1f s, val/nll %s",
             "loaded from the MAP cache" if metrics.get("map_cache/hit") else "trained", trainer.current_epoch,
             trainer.global_step, metrics["time/fit_s"], f"{metrics['val/nll']:.4f}" if "val/nll" in metrics else "-")
    return datamodule, module, trainer, metrics


def guard_counts(module: MAPCore, trainer) -> dict[str, float]:
    """Skipped batches (``on_nonfinite_loss=skip``) and online marglik's rejected hyper steps,
    for metrics.json; each non-zero count is also logged as a warning."""
    counts = {}
    if module.on_nonfinite_loss == "skip":
        counts["train/skipped_batches"] = float(module.n_skipped_batches)
        if module.n_skipped_batches:
            log.warning("%d training batches had a non-finite loss and were skipped (on_nonfinite_loss=skip)",
                        module.n_skipped_batches)
    for callback in trainer.callbacks:
        if isinstance(callback, OnlineMarglikCore):
            counts["marglik/rejected_steps"] = float(callback.n_rejected)
            counts["marglik/accepted_steps"] = float(callback.hyper_steps_done)
    return counts


class NonFiniteMetricsError(RuntimeError):
    """The run finished but some final metrics are nan / inf: it is marked failed, not finished."""


def check_final_metrics(metrics: dict[str, float], path: Path) -> None:
    """Raise ``NonFiniteMetricsError`` naming every non-finite metric (already saved in ``path``)."""
    bad = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not math.isfinite(v)}
    if bad:
        raise NonFiniteMetricsError(f"{len(bad)} final metrics are not finite: {bad}; the run counts as failed "
                                    f"(all metrics are kept in {path})")


def validation_nll(module: MAPCore, datamodule: LabDataModule) -> float:
    """Mean NLL of the MAP network on the validation set."""
    module.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for x, y in datamodule.val_dataloader():
            total += float(module.nll(module(x), y))
            n += len(x)
    return total / n


def loader_rmse(module: MAPCore, loader) -> float:
    """Root mean squared error of the MAP network over ``loader``'s rows (standardised units)."""
    module.eval()
    with torch.no_grad():
        err = [(module(x) - y.reshape(len(y), -1)).pow(2) for x, y in loader]
    return float(torch.cat(err).mean().sqrt())


REFIT_NAME = "refit"  # the folder of map_grid_refit's last training


def grid_point_name(delta: float) -> str:
    """The folder (under the run's) of the ``map_grid`` training with prior precision ``delta``."""
    return f"grid_{delta:g}"


def grid_point_config(cfg: DictConfig, delta: float, name: str) -> DictConfig:
    """The config of one training of ``map_grid``, in the subfolder ``name`` of the run's: prior
    precision ``delta``, no grid (so it shares the MAP cache with a plain run of that prior
    precision), and an explicit ``checkpoint.dirpath`` narrowed to ``<dirpath>/<name>`` so that
    the grid's trainings neither overwrite nor resume each other's checkpoints."""
    point = cfg.copy()
    point.prior.prior_precision = float(delta)
    point.map_grid, point.map_grid_refit = None, False
    if point.checkpoint.get("dirpath"):
        point.checkpoint.dirpath = str(Path(point.checkpoint.dirpath) / name)
    return point


def refit_config(cfg: DictConfig, delta: float) -> DictConfig:
    """The config of ``map_grid_refit``'s last training (named ``refit``): a grid point of ``delta``
    with the validation rows given back to training (``data.val_fraction`` or ``data.n_val`` set
    to 0, see ``HELD_OUT_VALIDATION``)."""
    refit = grid_point_config(cfg, delta, REFIT_NAME)
    refit.data[HELD_OUT_VALIDATION[refit.data._target_]] = 0
    return refit


def train_map_grid(cfg: DictConfig, output_dir: Path, loggers, loop: str | None = None):
    """MAP with its prior precision (the weight decay, ``delta = weight_decay * N``) chosen from
    ``map_grid`` by the validation NLL; each grid point is trained from the same seed.

    ``map_grid_refit=false``: the chosen grid network is the MAP; for regression its noise std is
    its validation RMSE. ``map_grid_refit=true`` (the heteroscedastic-nn authors' MAP-CV): the MAP
    is trained once more, from the same seed, with the chosen delta on all training rows
    (validation rows included); for regression its noise std is its training RMSE (the maximum-
    likelihood noise given the network). ``val/nll`` is the chosen grid point's either way."""
    best, grid_metrics, total_time, resumed = None, {}, 0.0, 0.0
    for delta in cfg.map_grid:
        name = grid_point_name(delta)
        datamodule, module, trainer, metrics = train_map(grid_point_config(cfg, delta, name), output_dir / name,
                                                         loggers=[], loop=loop)
        metrics["val/nll"] = validation_nll(module, datamodule)
        grid_metrics[f"grid/prior_{delta:g}/val_nll"] = metrics["val/nll"]
        total_time += metrics["time/fit_s"]
        resumed += metrics.get("checkpoint/resumed_fit_s", 0.0)
        if best is None or metrics["val/nll"] < best[4]["val/nll"]:
            best = (delta, datamodule, module, trainer, metrics)
    best_delta, datamodule, module, trainer, metrics = best
    val_nll = metrics["val/nll"]
    if cfg.get("map_grid_refit", False):  # the grid's own value, not the module's float32 copy of it
        datamodule, module, trainer, metrics = train_map(refit_config(cfg, best_delta), output_dir / REFIT_NAME,
                                                         loggers=loggers, loop=loop)
        total_time += metrics["time/fit_s"]
        resumed += metrics.get("checkpoint/resumed_fit_s", 0.0)
        noise_rows = datamodule.train_eval_dataloader()
    else:
        noise_rows = datamodule.val_dataloader()
    if module.likelihood == "regression":
        module.set_sigma_noise(loader_rmse(module, noise_rows))
    metrics = {**metrics, **grid_metrics, "val/nll": val_nll, "time/fit_s": total_time,
               "hparams/prior_precision": float(module.prior_precision.mean())}
    metrics.pop("checkpoint/resumed_fit_s", None)
    if resumed:  # every training's seconds before the checkpoints it resumed
        metrics["checkpoint/resumed_fit_s"] = resumed
    return datamodule, module, trainer, metrics


def train_target_std(datamodule: LabDataModule) -> float:
    """Std of the training targets in original units (over all outputs): the RMSE of predicting
    their mean."""
    mean = 0.0 if datamodule.target_mean is None else datamodule.target_mean
    std = 1.0 if datamodule.target_std is None else datamodule.target_std
    y = torch.cat([y.reshape(len(y), -1) for _, y in datamodule.train_eval_dataloader()]) * std + mean
    return float((y - y.mean(0)).pow(2).mean().sqrt())


def warn_if_underfit(metrics: dict[str, float], target_std: float) -> bool:
    """Log a warning when the MAP test RMSE (original units) is not below the training targets' std
    ``target_std``, i.e. the network does no better than predicting the mean: almost always too few
    training steps (``trainer.max_epochs``) for a small dataset. Returns whether it warned."""
    rmse = metrics.get("test/map/rmse")
    if rmse is None or rmse < target_std:
        return False
    log.warning("Under-trained? test/map/rmse %.4g >= the target std %.4g (predicting the mean does as well): "
                "raise trainer.max_epochs (small UCI sets need hundreds of epochs; see the README)", rmse, target_std)
    return True


def run(cfg: DictConfig, output_dir: Path) -> dict[str, float]:
    """Validate, build, train and evaluate one run; returns the final metrics."""
    with config_phase():
        validate_config(cfg)
        if _uses_augmentation(cfg):  # mode none needs no check (its module imports Lightning)
            from laplace_lab.training.augmentation import validate_augmentation_config

            validate_augmentation_config(cfg)
        check_landscape_run(validate_evaluation_config(cfg.evaluation), cfg.curvature.hessian_structure,
                            needs_posthoc_laplace(cfg))
        ensemble.validate_ensemble_config(cfg)
        validate_checkpoint_config(cfg)
        check_accelerator(cfg.trainer)
        loop = loop_choice.choose_loop(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    set_cpu_modes(cfg)
    if ensemble.enabled(cfg) and cfg.ensemble.member is not None:  # train one member into the MAP cache
        return ensemble.run_member_job(cfg, output_dir, train_map)
    loggers = build_loggers(cfg, output_dir, plain=loop == "plain")
    phases = PhaseLog(output_dir)
    phases.start("MAP training", training_plan(cfg, loop))
    if cfg.map_grid:
        datamodule, module, trainer, metrics = train_map_grid(cfg, output_dir, loggers, loop)
    else:
        datamodule, module, trainer, metrics = train_map(cfg, output_dir, loggers, loop)
    # the loops' teardown moved it to the CPU: fit the Laplace where it trained
    module.to(trainer.root_device if loop == "plain" else trainer.strategy.root_device)
    record_devices(output_dir, trainer, module)
    if module.likelihood == "regression":
        metrics["hparams/sigma_noise"] = module.sigma_noise.item()
    la = None
    if needs_posthoc_laplace(cfg):
        c = cfg.curvature
        phases.start("Laplace fit", f"{c.subset_of_weights} {c.hessian_structure} {c.type}, one pass over the "
                     f"{datamodule.n_train} training rows, then the prior by {cfg.marglik.get('posthoc_prior', 'none')}")
        la, la_metrics = fit_posthoc_laplace(cfg, module, datamodule)
        metrics.update(la_metrics)
    extra_predictors = None
    if ensemble.enabled(cfg):  # members 1..K-1 and the mixtures (member 0 is the network above)
        phases.start("Ensemble members", f"{cfg.ensemble.size - 1} more networks, each trained like the first")
        extra_predictors, ensemble_metrics = ensemble.fit_members(cfg, output_dir, module, la, train_map)
        metrics.update(ensemble_metrics)
    for logger in loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
    if cfg.evaluation.enabled:
        phases.start("Evaluation", "an estimate of its time follows the test-set pass")
        start = time.perf_counter()
        metrics.update(evaluate(cfg, module, datamodule, la, loggers, output_dir, trainer.global_step,
                                extra_predictors, on_eta=phases.eta))
        log.info("Evaluation: %d metrics, %.1f s", len(metrics), time.perf_counter() - start)
        if module.likelihood != "classification":
            warn_if_underfit(metrics, train_target_std(datamodule))
    finish_loggers(loggers)
    write_text_atomic(output_dir / "metrics.json", json.dumps(metrics, indent=2))
    headline = {k: v for k, v in metrics.items() if k.startswith(("test/", "time/", "hparams/", "laplace/"))}
    print("Final metrics:\n" + "\n".join(f"  {k}: {v:.4f}" for k, v in headline.items()))
    print_laplace_summary(cfg, metrics, module.likelihood)
    phases.finish()
    check_final_metrics(metrics, output_dir / "metrics.json")
    return metrics


def training_plan(cfg: DictConfig, loop: str) -> str:
    """What the MAP training phase will run, for its start line."""
    grid = f"{len(cfg.map_grid)} trainings (map_grid){' and a refit' if cfg.get('map_grid_refit') else ''} of " \
        if cfg.map_grid else ""
    return f"{grid}{cfg.trainer.max_epochs} epochs, {loop} loop; the remaining time is logged after the first epoch"


def print_laplace_summary(cfg: DictConfig, metrics: dict[str, float], likelihood: str) -> None:
    """Print what the Laplace predictive changed against the MAP (``evaluation.summary``), if both ran."""
    from laplace_lab.evaluation.labels import dataset_label, laplace_label
    from laplace_lab.evaluation.summary import format_summary

    text = format_summary(metrics, laplace_label(cfg, likelihood), dataset_label(cfg.data),
                          OmegaConf.select(cfg, "evaluation.ood.far_away_alpha"))
    if text:
        print(text)


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
