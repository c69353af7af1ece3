"""One MAP training: seed, build, callbacks, trainer, fit (or load from the MAP cache).

``train_map(run, output_dir, loggers, loop)`` is the unit every caller repeats: the entry point once,
``training.map_grid`` per grid point, ``training.ensemble`` per member. The loop is Lightning's
Trainer or the plain loop (``training.loops``, picked by ``training.loop_choice``); the callbacks
are the ``callbacks`` config's entries (``build_callbacks``, ``training.callbacks``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hydra.utils import get_object

from laplace_lab.config.schema import RunConfig
from laplace_lab.data.base import LabDataModule
from laplace_lab.training import loop_choice, map_cache
from laplace_lab.training.build import build
from laplace_lab.training.laplace_plan import check_run_laplace
from laplace_lab.training.loops import LIGHTNING, TrainingLoop
from laplace_lab.training.module import MAPCore
from laplace_lab.training.resume import check_resume, resume_path, run_fingerprint, run_identity
from laplace_lab.training.validation_nll import validation_nll

log = logging.getLogger(__name__)


def build_callbacks(run: RunConfig, output_dir: Path, loop: TrainingLoop = LIGHTNING) -> list:
    """The ``callbacks`` config's entries, in order (``training.callbacks``): a class is built with its
    typed options (``options_type.from_run(run)``; left out where that is ``None``), as the class ``loop``
    runs for it (its Lightning twin under Lightning); a function returns its callbacks (``(run, output_dir, loop)``)."""
    callbacks = []
    for node in run.callbacks.values():
        target = get_object(node["_target_"])
        if not isinstance(target, type):
            callbacks += target(run, output_dir, loop)
            continue
        options = target.options_type.from_run(run)
        if options is not None:
            callbacks.append(loop.training_class(target)(options))
    return callbacks


def training_plan(run: RunConfig, loop: TrainingLoop) -> str:
    """What the MAP training phase will run, for its start line."""
    grid = f"{len(run.map_grid)} trainings (map_grid){' and a refit' if run.map_grid_refit else ''} of " \
        if run.map_grid else ""
    return f"{grid}{run.trainer.max_epochs} epochs, {loop} loop; the remaining time is logged after the first epoch"


def train_map(run: RunConfig, output_dir: Path, loggers, loop: TrainingLoop | None = None
              ) -> tuple[LabDataModule, MAPCore, object, dict]:
    """Seed, build and train (or load from the MAP cache) one network with ``loop`` (``training.loops``;
    None: ``trainer.loop``'s choice); returns its final metrics ``time/fit_s`` and
    ``val/nll`` (the last validation NLL, the objective of sweeps)."""
    loop = loop or loop_choice.choose_loop(run)
    loop.seed(run.seed)
    resume = resume_path(run, output_dir)
    if resume:
        check_resume(run, resume)
    datamodule, module = build(run, loop)
    if run.needs_posthoc_laplace:  # its plan in one line; what cannot fit is refused before training
        check_run_laplace(run, datamodule, module.model, module.likelihood)
    module.run_identity = run_identity(run)
    if run.checkpoint.enabled:
        module.run_fingerprint = run_fingerprint(run)
    callbacks = build_callbacks(run, output_dir, loop)
    trainer = loop.make_trainer(run, output_dir, loggers, callbacks)
    start = time.perf_counter()
    cached = map_cache.cache_path(run, datamodule)
    if map_cache.load(module, cached):
        datamodule.setup("fit")
        metrics = {"time/fit_s": 0.0, "map_cache/hit": 1.0, **cached_validation(module, datamodule)}
    else:
        module.fit_clock_start = start
        loop.fit(trainer, module, datamodule, resume)
        map_cache.save(module, cached, map_cache.key_contents(run, datamodule) if cached else None)
        # with a resumed checkpoint: the earlier launches' training time up to it, plus this launch's
        metrics = {"time/fit_s": module.fit_seconds()}
        if resume:
            metrics["checkpoint/resumed_fit_s"] = module.fit_seconds_before
    if "val/nll" in trainer.callback_metrics:
        metrics["val/nll"] = float(trainer.callback_metrics["val/nll"])
    for cb in callbacks:  # final augmentation ranges, online marglik's step counts
        metrics.update(getattr(cb, "final_metrics", dict)())
    metrics.update(skipped_batches(module))
    log.info("MAP training: %s, %d epochs, %d steps, %.1f s, val/nll %s",
             "loaded from the MAP cache" if metrics.get("map_cache/hit") else "trained", trainer.current_epoch,
             trainer.global_step, metrics["time/fit_s"], f"{metrics['val/nll']:.4f}" if "val/nll" in metrics else "-")
    return datamodule, module, trainer, metrics


def cached_validation(module: MAPCore, datamodule: LabDataModule) -> dict[str, float]:
    """``val/nll`` of a network loaded from the MAP cache (no trainer ran, so no validation was logged):
    the mean validation NLL over the whole validation set, as the last validation epoch logs it (the
    sweep objective, Optuna's); ``{}`` for an empty validation set."""
    val = getattr(datamodule, "val_set", None)
    if val is None or len(val) == 0:
        return {}
    return {"val/nll": validation_nll(module, datamodule)}


def skipped_batches(module: MAPCore) -> dict[str, float]:
    """``train/skipped_batches`` (``on_nonfinite_loss=skip``) for metrics.json, and a warning when non-zero."""
    if module.on_nonfinite_loss != "skip":
        return {}
    if module.n_skipped_batches:
        log.warning("%d training batches had a non-finite loss and were skipped (on_nonfinite_loss=skip)",
                    module.n_skipped_batches)
    return {"train/skipped_batches": float(module.n_skipped_batches)}
