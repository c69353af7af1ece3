"""Lightning loggers of a run: CSV always, wandb (offline by default) when enabled."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger

WANDB_MODES = ("offline", "online", "disabled")


def build_loggers(cfg: DictConfig, output_dir: Path) -> list[Logger]:
    """CSV logger in ``output_dir/csv``; wandb run in ``output_dir/wandb`` with the flattened config."""
    loggers: list[Logger] = []
    if cfg.logger.get("csv", True):
        loggers.append(CSVLogger(save_dir=str(output_dir), name="csv", version=""))
    wandb_cfg = cfg.logger.get("wandb", {})
    if wandb_cfg.get("enabled", False):
        mode = wandb_cfg.get("mode", "offline")
        if mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode={mode!r} is not supported; allowed: {list(WANDB_MODES)}")
        loggers.append(
            WandbLogger(
                save_dir=str(output_dir),
                project=wandb_cfg.get("project", "laplace-lab"),
                entity=wandb_cfg.get("entity"),
                group=wandb_cfg.get("group"),
                job_type=wandb_cfg.get("job_type"),
                tags=list(wandb_cfg.get("tags", [])),
                mode=mode,
                config=OmegaConf.to_container(cfg, resolve=True),
            )
        )
    return loggers


def finish_loggers(loggers: list[Logger]) -> None:
    """Flush every logger and close the wandb run, so the next run in this process starts a new one."""
    for logger in loggers:
        logger.finalize("success")
        if isinstance(logger, WandbLogger):
            logger.experiment.finish()
