"""Hydra entry point: ``python -m laplace_lab.train [overrides]`` (alias ``laplace-lab-train``).

Composes data, model, optimiser, trainer and loggers from ``conf/``, trains a MAP network with
PyTorch Lightning, evaluates it on the test set, and writes into the run directory:
``config_resolved.yaml``, ``metrics.json``, ``csv/metrics.csv`` and (offline) ``wandb/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import hydra
import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from laplace_lab.config_validation import validate_config
from laplace_lab.data.base import LabDataModule
from laplace_lab.run_loggers import build_loggers
from laplace_lab.training import MAPModule
from laplace_lab.training.online_marglik import OnlineMarglik
from laplace_lab.training.posthoc import fit_posthoc_laplace, laplace_kwargs, needs_posthoc_laplace

log = logging.getLogger(__name__)
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def instantiate(node, *args, **kwargs):
    """``hydra.utils.instantiate`` that re-raises our own errors unwrapped.

    Hydra wraps constructor errors in ``InstantiationException``; the original
    ``ValueError`` / ``FileNotFoundError`` names the option and the allowed values, so show it.
    """
    try:
        return hydra.utils.instantiate(node, *args, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, (ValueError, FileNotFoundError)):
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


def build(cfg: DictConfig) -> tuple[LabDataModule, MAPModule]:
    """Instantiate the data module and the LightningModule (no training yet)."""
    datamodule: LabDataModule = instantiate(cfg.data)
    likelihood = resolve_likelihood(cfg, datamodule)
    n_out = datamodule.num_outputs * (2 if likelihood == "heteroscedastic_regression" else 1)
    model = instantiate(cfg.model)(input_shape=datamodule.input_shape, num_outputs=n_out)
    scheduler = instantiate(cfg.lr_scheduler) if cfg.get("lr_scheduler") else None
    module = MAPModule(
        model=model,
        likelihood=likelihood,
        n_data=datamodule.n_train,
        optimizer=instantiate(cfg.optimizer),
        lr_scheduler=scheduler,
        prior_precision=cfg.prior.prior_precision,
        sigma_noise=cfg.sigma_noise,
        temperature=cfg.temperature,
    )
    return datamodule, module


def build_callbacks(cfg: DictConfig, output_dir: Path) -> list[pl.Callback]:
    """Online marglik (``marglik=online``) and checkpointing (``checkpoint.enabled``)."""
    callbacks: list[pl.Callback] = []
    if cfg.marglik.mode == "online":
        m = cfg.marglik
        callbacks.append(OnlineMarglik(
            laplace_kwargs(cfg.curvature), prior_structure=cfg.prior.structure, frequency=m.frequency,
            n_steps=m.n_steps, burnin=m.burnin, lr_hyp=m.lr_hyp, lr_hyp_min=m.lr_hyp_min,
            optimize_sigma=m.optimize_sigma, early_stopping=m.early_stopping, log_min=m.log_min,
            log_max=m.log_max, fit_batch_size=cfg.curvature.get("fit_batch_size"),
        ))
    if cfg.checkpoint.enabled:
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=cfg.checkpoint.dirpath or str(output_dir / "checkpoints"), every_n_epochs=cfg.checkpoint.every_n_epochs,
            save_last=True, save_top_k=-1, filename="epoch{epoch}", auto_insert_metric_name=False,
        ))
    return callbacks


def test_metrics_in_original_units(module: MAPModule, datamodule: LabDataModule) -> dict[str, float]:
    """MAP test metrics; regression log likelihood and RMSE in the original target units."""
    from laplace_lab.training.nll import natural_to_mean_var

    module.eval()
    device = next(module.parameters()).device
    totals: dict[str, float] = {}
    n = 0
    with torch.no_grad():
        for x, y in datamodule.test_dataloader():
            x, y = x.to(device), y.to(device)
            f = module(x)
            n += len(x)
            if module.likelihood == "classification":
                totals["acc"] = totals.get("acc", 0.0) + (f.argmax(-1) == y).sum().item()
                totals["nll"] = totals.get("nll", 0.0) + module.nll(f, y).item()
                continue
            if module.likelihood == "heteroscedastic_regression":
                mean, var = natural_to_mean_var(f)
            else:
                mean, var = f, module.sigma_noise.pow(2).expand_as(f)
            scale = datamodule.target_std.to(device)
            y = y.reshape(mean.shape)
            err2 = ((mean - y) * scale) ** 2
            var_orig = var * scale**2
            log_lik = -0.5 * (err2 / var_orig + torch.log(2 * math.pi * var_orig))
            totals["se"] = totals.get("se", 0.0) + err2.sum().item()
            totals["log_lik"] = totals.get("log_lik", 0.0) + log_lik.sum().item()
            totals["n_out"] = totals.get("n_out", 0.0) + mean.numel()
    if module.likelihood == "classification":
        return {"test/map/acc": totals["acc"] / n, "test/map/nll": totals["nll"] / n}
    return {
        "test/map/rmse": math.sqrt(totals["se"] / totals["n_out"]),
        "test/map/log_lik": totals["log_lik"] / n,
    }


def run(cfg: DictConfig, output_dir: Path) -> dict[str, float]:
    """Validate, build, train and evaluate one run; returns the final metrics."""
    validate_config(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    pl.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    loggers = build_loggers(cfg, output_dir)
    callbacks = build_callbacks(cfg, output_dir)
    trainer = pl.Trainer(**cfg.trainer, logger=loggers, default_root_dir=str(output_dir), callbacks=callbacks,
                         enable_checkpointing=cfg.checkpoint.enabled)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.checkpoint.resume_from)
    metrics = {"time/fit_s": time.perf_counter() - start}
    metrics.update(test_metrics_in_original_units(module, datamodule))
    if module.likelihood == "regression":
        metrics["hparams/sigma_noise"] = module.sigma_noise.item()
    if needs_posthoc_laplace(cfg):
        _, la_metrics = fit_posthoc_laplace(cfg, module, datamodule)
        metrics.update(la_metrics)
    for logger in loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
        logger.finalize("success")
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print("Final metrics:\n" + "\n".join(f"  {k}: {v:.4f}" for k, v in metrics.items()))
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
