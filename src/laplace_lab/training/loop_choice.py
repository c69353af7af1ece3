"""``trainer.loop``: which loop trains the MAP network, Lightning's Trainer or the plain loop.

- ``lightning``: ``pytorch_lightning.Trainer`` (every feature; imports Lightning, seconds);
- ``plain``: ``training.plain_loop`` (same hooks, same order, bit-identical metrics) for runs that
  need nothing else; asked for on a run that does need Lightning, it is a config error naming why;
- ``auto`` (default): ``plain`` when the run qualifies and trains on the CPU, else ``lightning``;
  the choice and its reasons are logged.

``choose_loop`` returns the chosen loop's object (``training.loops``: ``PLAIN`` or ``LIGHTNING``);
this is the one place that reads the ``trainer.loop`` string.

A run qualifies when ``lightning_needs(run)`` is empty: in-memory tensor data read in the main
process (a data module that declares ``in_memory``: UCI, sinusoid, toy2d); one CPU or CUDA device; the trainer options at values the plain
loop runs as Lightning does (``PLAIN_TRAINER``: no gradient clipping, all batches, validation
at epoch ends, no model summary, ...); no checkpoints (saving or resuming), no augmentation
callback, no fused online marglik. A W&B run is no reason for Lightning: the plain loop logs to
its own (``io.wandb_run.PlainWandbLogger``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from laplace_lab.config.schema import TRAINER, TRAINER_KEYS, RunConfig
from laplace_lab.data.registry import data_modules, required_class
from laplace_lab.training.loops import LIGHTNING, PLAIN, TrainingLoop
from laplace_lab.training.plain_loop import resolve_device

log = logging.getLogger(__name__)
LOOPS = ("auto", "lightning", "plain")  # the choices of trainer.loop (config.schema.TrainerConfig)


def _one(v: Any) -> bool:
    return v in (1, 1.0) and not isinstance(v, bool)


# trainer option -> (values the plain loop runs as Lightning does, those values in words)
PLAIN_TRAINER: dict[str, tuple[Callable[[Any], bool], str]] = {
    "_target_": (lambda v: v == TRAINER, TRAINER),  # PlainTrainer stands in for it
    "loop": (lambda v: True, "any"),
    "max_epochs": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "accelerator": (lambda v: str(v).lower() in ("auto", "cpu", "gpu", "cuda"), "auto, cpu, gpu or cuda"),
    "devices": (_one, "1"),
    "strategy": (lambda v: v == "auto", "auto"),
    "num_nodes": (_one, "1"),
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


def trainer_options(run: RunConfig) -> dict[str, Any]:
    """Every ``trainer.*`` option of the run: ours and the further Lightning arguments."""
    return {**{k: getattr(run.trainer, k) for k in TRAINER_KEYS}, **run.trainer.extra}


def lightning_needs(run: RunConfig) -> list[str]:
    """Why this run needs Lightning's Trainer (empty: the plain loop runs it the same way)."""
    needs = []
    for key, value in trainer_options(run).items():
        check = PLAIN_TRAINER.get(str(key))
        if check is None:
            needs.append(f"trainer.{key} (an option the plain loop does not implement)")
        elif not check[0](value):
            needs.append(f"trainer.{key}={value!r} (plain loop: {check[1]})")
    accelerator = str(run.trainer.accelerator).lower()
    if accelerator in ("auto", "gpu") and _mps_only():
        needs.append(f"trainer.accelerator={accelerator!r} on Apple MPS (plain loop: CPU or CUDA)")
    if not required_class(run.data).in_memory:  # (the data module declares it)
        in_memory = list(data_modules(lambda cls: cls.in_memory))
        needs.append(f"data._target_={run.data.get('_target_')!r} (plain loop: in-memory data, one of {in_memory})")
    if run.data.get("num_workers", 0):
        needs.append(f"data.num_workers={run.data['num_workers']} (plain loop: 0)")
    if run.checkpoint.enabled or run.checkpoint.resume_from:
        needs.append("checkpoint.enabled / checkpoint.resume_from (Lightning checkpoints)")
    if run.augmentation.wraps_model or run.augmentation.report:
        needs.append("augmentation (its callback runs under Lightning)")
    if run.marglik.online and run.marglik.fused:
        needs.append("marglik.fused=true (plain loop: fused=false)")
    return needs


def _mps_only() -> bool:
    import torch

    return not torch.cuda.is_available() and torch.backends.mps.is_available()


def choose_loop(run: RunConfig) -> TrainingLoop:
    """``PLAIN`` or ``LIGHTNING`` for this run (``trainer.loop``); logs the choice. ``plain`` asked
    for on a run that needs Lightning raises a ``ValueError`` naming what needs it."""
    loop = run.trainer.loop
    needs = [] if loop == "lightning" else lightning_needs(run)
    if loop == "auto" and not needs and resolve_device(run.trainer.accelerator).type != "cpu":
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
    return PLAIN if chosen == "plain" else LIGHTNING
