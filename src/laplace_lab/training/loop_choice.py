"""``trainer.loop``: which loop trains the MAP network, Lightning's Trainer or the plain loop.

- ``lightning``: ``pytorch_lightning.Trainer`` (every feature; imports Lightning, seconds);
- ``plain``: ``training.plain_loop`` (same hooks, same order, bit-identical metrics) for runs that
  need nothing else; asked for on a run that does need Lightning, it is a config error naming why;
- ``auto`` (default): ``plain`` when the run qualifies and trains on the CPU, else ``lightning``;
  the choice and its reasons are logged.

A run qualifies when ``lightning_needs(cfg)`` is empty: in-memory tensor data (UCI, sinusoid,
toy2d) read in the main process; one CPU or CUDA device; the trainer options at values the plain
loop runs as Lightning does (``PLAIN_TRAINER``: no gradient clipping, all batches, validation
at epoch ends, no model summary, ...); no wandb logger, no checkpoints (saving or resuming), no
augmentation callback, no fused online marglik.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from laplace_lab.training.plain_loop import resolve_device

log = logging.getLogger(__name__)
LOOPS = ("auto", "lightning", "plain")
IN_MEMORY_DATA = ("UCIDataModule", "SinusoidDataModule", "Toy2DDataModule")  # laplace_lab.data classes


def _one(v: Any) -> bool:
    return v in (1, 1.0) and not isinstance(v, bool)


# trainer option -> (values the plain loop runs as Lightning does, those values in words)
PLAIN_TRAINER: dict[str, tuple[Callable[[Any], bool], str]] = {
    "loop": (lambda v: True, "any"),
    "max_epochs": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "accelerator": (lambda v: str(v).lower() in ("auto", "cpu", "gpu", "cuda"), "auto, cpu, gpu or cuda"),
    "devices": (_one, "1"),
    "deterministic": (lambda v: v in (False, None), "false or null"),
    "log_every_n_steps": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "enable_progress_bar": (lambda v: True, "any"),
    "enable_model_summary": (lambda v: v in (False, None), "false"),
    "gradient_clip_val": (lambda v: v is None or v == 0, "null or 0"),
    "limit_train_batches": (_one, "1.0"),
    "limit_val_batches": (_one, "1.0"),
    "check_val_every_n_epoch": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                                "an integer >= 1"),
    "fast_dev_run": (lambda v: v in (False, 0), "false"),
}


def validate_loop(cfg: DictConfig) -> str:
    """``trainer.loop`` (``auto`` when absent), checked against ``LOOPS``."""
    loop = cfg.trainer.get("loop", "auto")
    if loop not in LOOPS:
        raise ValueError(f"trainer.loop={loop!r} is not supported; allowed: {list(LOOPS)}")
    return loop


def lightning_needs(cfg: DictConfig) -> list[str]:
    """Why this run needs Lightning's Trainer (empty: the plain loop runs it the same way)."""
    needs = []
    for key, value in cfg.trainer.items():
        check = PLAIN_TRAINER.get(str(key))
        if check is None:
            needs.append(f"trainer.{key} (an option the plain loop does not implement)")
        elif not check[0](value):
            needs.append(f"trainer.{key}={value!r} (plain loop: {check[1]})")
    accelerator = str(cfg.trainer.get("accelerator", "auto")).lower()
    if accelerator in ("auto", "gpu") and _mps_only():
        needs.append(f"trainer.accelerator={accelerator!r} on Apple MPS (plain loop: CPU or CUDA)")
    target = str(cfg.data.get("_target_", ""))
    if target.rpartition(".")[2] not in IN_MEMORY_DATA or not target.startswith("laplace_lab.data."):
        needs.append(f"data._target_={target!r} (plain loop: in-memory data, laplace_lab.data.{{{', '.join(IN_MEMORY_DATA)}}})")
    if cfg.data.get("num_workers", 0):
        needs.append(f"data.num_workers={cfg.data.num_workers} (plain loop: 0)")
    if cfg.logger.get("wandb", {}).get("enabled", False):
        needs.append("logger.wandb.enabled=true (a Lightning logger)")
    if cfg.checkpoint.get("enabled") or cfg.checkpoint.get("resume_from"):
        needs.append("checkpoint.enabled / checkpoint.resume_from (Lightning checkpoints)")
    aug = cfg.get("augmentation")
    if aug is not None and (aug.get("mode", "none") != "none" or aug.get("report")):
        needs.append("augmentation (its callback runs under Lightning)")
    if cfg.marglik.get("mode") == "online" and cfg.marglik.get("fused", False):
        needs.append("marglik.fused=true (plain loop: fused=false)")
    return needs


def _mps_only() -> bool:
    import torch

    return not torch.cuda.is_available() and torch.backends.mps.is_available()


def choose_loop(cfg: DictConfig) -> str:
    """``plain`` or ``lightning`` for this run (``trainer.loop``); logs the choice. ``plain`` asked
    for on a run that needs Lightning raises a ``ValueError`` naming what needs it."""
    loop = validate_loop(cfg)
    needs = [] if loop == "lightning" else lightning_needs(cfg)
    if loop == "auto" and not needs and resolve_device(cfg.trainer.get("accelerator", "auto")).type != "cpu":
        needs.append("a CUDA device (auto picks the plain loop on the CPU only: its CUDA path has not been "
                     "compared with Lightning on a GPU yet; trainer.loop=plain runs it there)")
    if loop == "plain" and needs:
        raise ValueError("trainer.loop=plain cannot run this config; it needs Lightning for: " + "; ".join(needs)
                         + f". Allowed: trainer.loop in {list(LOOPS)} (auto picks lightning here)")
    chosen = "lightning" if loop == "lightning" or needs else "plain"
    reason = ("" if loop != "auto" else
              ": " + ("in-memory data, one device, no Lightning-only feature" if chosen == "plain"
                      else "needs Lightning for " + "; ".join(needs)))
    log.info("Training loop: %s (trainer.loop=%s%s)", chosen, loop, reason)
    return chosen


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """``cfg.trainer`` without ``loop`` (our option): the keyword arguments of Lightning's Trainer."""
    return {k: v for k, v in cfg.trainer.items() if k != "loop"}
