"""The plain training loop (``trainer.loop=plain``): Lightning's ``fit`` for small in-memory runs,
without importing Lightning (seconds of imports, ~1 ms of loop per epoch).

``PlainTrainer.fit(module, datamodule)`` runs a ``MAPCore`` and ``OnlineMarglikCore`` callbacks
through the same hooks, in the same order, on the same batches as Lightning 2's ``Trainer.fit``
with one optimiser, automatic optimisation, validation at epoch ends and no gradient clipping
or accumulation (``training.loop_choice`` decides when a run qualifies):

- fit start: ``datamodule.prepare_data()`` / ``setup("fit")``, the module on the device in train
  mode, ``configure_optimizers()``, the callbacks' ``on_fit_start``, then Lightning's sanity check
  (``validation_step`` on the first two validation batches, nothing logged, random generators
  restored after it);
- every epoch: ``set_epoch`` on the training sampler, ``on_train_epoch_start``; per batch
  ``training_step`` -> ``zero_grad()`` -> ``backward`` (skipped when the step returns ``None``) ->
  ``on_after_backward`` -> ``optimizer.step()`` -> a step-interval lr scheduler's ``step()``
  (``training.schedules``); after the last batch the epoch-interval lr scheduler steps, then (every ``check_val_every_n_epoch`` epochs) the validation epoch (eval
  mode, ``torch.inference_mode``), then
  ``on_train_epoch_end``; the callbacks' ``on_train_end`` after the last epoch;
- logging as Lightning's: ``log_dict(..., on_epoch=True)`` values are float32 batch-size-weighted
  means over the epoch; the validation means and, when anything was logged, the training ones go
  to the loggers once per epoch with ``epoch`` and ``step = global_step - 1``; ``callback_metrics``
  keeps the last values (``val/nll``).

So seeds, data order, the torch RNG draws (one per ``DataLoader`` iterator) and every floating
point operation are the ones of the Lightning run: its metrics are bit-identical
(``tests/training/test_plain_loop.py``). The progress bar is one line per epoch range (tqdm)
instead of Lightning's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from contextlib import contextmanager

import torch

from laplace_lab.training.schedules import SCHEDULER_INTERVALS

log = logging.getLogger(__name__)
SANITY_VAL_STEPS = 2  # Lightning's num_sanity_val_steps default


class _EpochMeans:
    """Lightning's on-epoch mean of logged values: ``sum(v * B) / sum(B)``, ``v`` as float32 tensors."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def add(self, values: dict, batch_size: int | None) -> None:
        for key, value in values.items():
            value = (value.detach().clone() if isinstance(value, torch.Tensor) else torch.tensor(value)).squeeze()
            if value.dtype not in (torch.float32, torch.float64):
                value = value.to(torch.float32)
            b = 1 if batch_size is None else batch_size  # Lightning: 1 outside a batch (epoch-end hooks)
            self.sums[key] = self.sums.get(key, torch.tensor(0.0, device=value.device)) + value * b
            self.counts[key] = self.counts.get(key, torch.tensor(0, device=value.device)) + b

    def compute(self) -> dict[str, torch.Tensor]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


def seed_everything(seed: int) -> None:
    """Lightning's ``seed_everything(seed, workers=True)``: Python's, NumPy's and torch's generators
    and the environment variables Lightning sets (``PL_GLOBAL_SEED``, ``PL_SEED_WORKERS``)."""
    import random

    import numpy as np

    os.environ["PL_GLOBAL_SEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ["PL_SEED_WORKERS"] = "1"


def resolve_device(accelerator: str) -> torch.device:
    """``trainer.accelerator`` -> the device Lightning would use: ``cpu``, ``gpu`` / ``cuda``
    (the first visible CUDA device) or ``auto`` (CUDA if available, else the CPU)."""
    accelerator = str(accelerator).lower()
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", 0)
    return torch.device("cpu")


class PlainTrainer:
    """The state the module and callbacks read from their ``trainer`` (Lightning's names):
    ``current_epoch``, ``max_epochs``, ``global_step``, ``num_training_batches``,
    ``log_every_n_steps``, ``datamodule``, ``callbacks``, ``callback_metrics``.

    Args:
        max_epochs: epochs to train.
        device: where the module trains (``resolve_device``).
        loggers: objects with ``log_metrics(metrics, step)`` and ``save()`` (``csv_metrics``).
        callbacks: ``OnlineMarglikCore``-like objects with Lightning's hook names.
        log_every_n_steps: Lightning's option (the module's training-loss cadence reads it).
        enable_progress_bar: a tqdm bar over the epochs.
        check_val_every_n_epoch: validate after every this many epochs (Lightning's option).
    """

    def __init__(self, max_epochs: int, device: torch.device, loggers: Iterable = (), callbacks: Iterable = (),
                 log_every_n_steps: int = 50, enable_progress_bar: bool = False, check_val_every_n_epoch: int = 1):
        self.max_epochs = int(max_epochs)
        self.root_device = device
        self.loggers = list(loggers)
        self.callbacks = list(callbacks)
        self.log_every_n_steps = int(log_every_n_steps)
        self.enable_progress_bar = enable_progress_bar
        self.check_val_every_n_epoch = int(check_val_every_n_epoch)
        self.current_epoch = 0
        self.global_step = 0
        self.num_training_batches = 0
        self.datamodule = None
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.accelerator_name = device.type
        self.device_ids = [device.index or 0]
        self._means: _EpochMeans | None = None
        self._sanity = False

    # --- what the module and callbacks call -----------------------------------------------------
    def log_dict(self, values: dict, on_step: bool = False, on_epoch: bool = True, batch_size: int | None = None,
                 prog_bar: bool = False) -> None:
        """``LightningModule.log_dict`` for ``on_step=False, on_epoch=True`` (the only use here)."""
        if on_step or not on_epoch:
            raise ValueError("the plain loop logs epoch means only (on_step=False, on_epoch=True); "
                             "allowed: trainer.loop=lightning for step-level logging")
        if not self._sanity:
            self._means.add(values, batch_size)

    # --- the loop --------------------------------------------------------------------------------
    def _hooks(self, name: str, module) -> None:
        for callback in self.callbacks:
            hook = getattr(callback, name, None)
            if hook is not None:
                hook(self, module)

    def _to_device(self, batch):
        return tuple(t.to(self.root_device) for t in batch)

    def _log_epoch(self, metrics: dict[str, torch.Tensor]) -> None:
        """One row per call, as Lightning's logger connector: ``epoch`` added, ``step = global_step - 1``."""
        if not metrics:
            return
        self.callback_metrics.update(metrics)
        row = {k: v.item() for k, v in metrics.items()}
        row.setdefault("epoch", self.current_epoch)
        for logger in self.loggers:
            logger.log_metrics(row, step=self.global_step - 1)
            logger.save()

    def _validate(self, module, loader, max_batches: int | None = None) -> dict[str, torch.Tensor]:
        module.zero_grad(set_to_none=True)
        module.eval()
        self._means = _EpochMeans()
        with torch.inference_mode():
            for batch_idx, batch in enumerate(loader):
                if max_batches is not None and batch_idx >= max_batches:
                    break
                module.validation_step(self._to_device(batch), batch_idx)
        module.train()
        return self._means.compute()

    def fit(self, module, datamodule) -> None:
        """Train ``module`` on ``datamodule``'s training loader (see the module docstring)."""
        self.datamodule = datamodule
        module.trainer = self
        datamodule.prepare_data()
        datamodule.setup("fit")
        module.to(self.root_device)
        module.train()
        train_loader, val_loader = datamodule.train_dataloader(), datamodule.val_dataloader()
        self.num_training_batches = len(train_loader)
        self.estimated_stepping_batches = self.max_epochs * self.num_training_batches  # as Lightning's
        optimizer, scheduler, interval = _optimizer_and_scheduler(module.configure_optimizers())
        n_val = len(val_loader)
        self._hooks("on_fit_start", module)
        if n_val:  # Lightning's sanity check: nothing logged, the random generators restored after it
            self._sanity = True
            with _isolated_rng():
                self._validate(module, val_loader, max_batches=SANITY_VAL_STEPS)
            self._sanity = False
        bar = _progress(self.max_epochs) if self.enable_progress_bar else None
        for epoch in range(self.max_epochs):
            self.current_epoch = epoch
            _set_sampler_epoch(train_loader, epoch)
            self._hooks("on_train_epoch_start", module)
            self._means = _EpochMeans()
            for batch_idx, batch in enumerate(train_loader):
                loss = module.training_step(self._to_device(batch), batch_idx)
                optimizer.zero_grad()
                if loss is not None:
                    loss.backward()
                    self._hooks("on_after_backward", module)
                optimizer.step()
                self.global_step += 1
                if scheduler is not None and interval == "step":
                    scheduler.step()
            train_means = self._means
            if scheduler is not None and interval == "epoch":
                scheduler.step()
            if n_val and (epoch + 1) % self.check_val_every_n_epoch == 0:
                self._log_epoch(self._validate(module, val_loader))
            self._means = train_means
            self._hooks("on_train_epoch_end", module)
            self._log_epoch(self._means.compute())
            if bar is not None:
                bar.update(1)
                if "val/nll" in self.callback_metrics:
                    bar.set_postfix({"val/nll": f"{self.callback_metrics['val/nll'].item():.3f}"}, refresh=False)
        self.current_epoch = self.max_epochs
        if bar is not None:
            bar.close()
        self._hooks("on_train_end", module)
        module.cpu()  # as Lightning's teardown


@contextmanager
def _isolated_rng():
    """Lightning's ``isolate_rng``: torch's (CPU and CUDA), Python's and NumPy's generator states
    are restored on exit."""
    import random

    import numpy as np

    states = (torch.get_rng_state(), random.getstate(), np.random.get_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def _optimizer_and_scheduler(config) -> tuple[torch.optim.Optimizer, object | None, str]:
    """``configure_optimizers()``'s result as ``(optimizer, scheduler, interval)``: an optimiser alone,
    ``{"optimizer", "lr_scheduler": scheduler}`` (stepped every epoch, Lightning's default) or
    ``{"optimizer", "lr_scheduler": {"scheduler", "interval"}}`` with interval ``epoch`` or ``step``
    (stepped after every optimiser step); other keys of Lightning's scheduler dict are refused."""
    if isinstance(config, torch.optim.Optimizer):
        return config, None, "epoch"
    scheduler, interval = config.get("lr_scheduler"), "epoch"
    if isinstance(scheduler, dict):
        other = sorted(set(scheduler) - {"scheduler", "interval"})
        interval = scheduler.get("interval", "epoch")
        if other or interval not in SCHEDULER_INTERVALS:
            raise ValueError(f"the plain loop takes a scheduler dict with keys scheduler and interval "
                             f"(allowed intervals: {list(SCHEDULER_INTERVALS)}); got keys {sorted(scheduler)}, "
                             f"interval {interval!r}; for the others use trainer.loop=lightning")
        scheduler = scheduler["scheduler"]
    return config["optimizer"], scheduler, interval


def _set_sampler_epoch(loader, epoch: int) -> None:
    """As Lightning at every epoch start: ``set_epoch`` on the loader's sampler and batch sampler."""
    for sampler in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        if sampler is not None and callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="Epochs", mininterval=0.5, dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")

