"""The training callbacks, built from the run's typed config: the factories that ``conf/callbacks/``
names by ``_target_``. Each takes ``(run, output_dir, loop)`` and returns a list of callbacks (empty
where the run does not use it): the classes ``loop`` runs (``training.loops``: Lightning callbacks,
or the plain loop's hook objects). Lightning is imported only where a Lightning callback is built.
"""

from __future__ import annotations

from pathlib import Path

from laplace_lab.config.schema import RunConfig
from laplace_lab.sweeps.ranks import is_first_process
from laplace_lab.training.epoch_eta import EpochETA
from laplace_lab.training.loops import TrainingLoop
from laplace_lab.training.online_marglik import OnlineMarglikCore
from laplace_lab.training.resume import checkpoint_dir


def online_marglik(run: RunConfig, output_dir: Path, loop: TrainingLoop) -> list:
    """``marglik=online``: Algorithm 1 of Immer et al. 2021 (``training.online_marglik``)."""
    m = run.marglik
    if not m.online:
        return []
    cls = loop.training_class(OnlineMarglikCore)
    return [cls(run.curvature.laplace_kwargs(), prior_structure=run.prior.structure, frequency=m.frequency,
                n_steps=m.n_steps, burnin=m.burnin, lr_hyp=m.lr_hyp, lr_hyp_min=m.lr_hyp_min,
                optimize_sigma=m.optimize_sigma, early_stopping=m.early_stopping, log_min=m.log_min,
                log_max=m.log_max, fit_batch_size=run.curvature.fit_batch_size, fused=m.fused)]


def augmentation_marglik(run: RunConfig, output_dir: Path, loop: TrainingLoop) -> list:
    """``augmentation=fixed|learned`` (and ``none`` with ``report=true`` under online marglik): logs the
    ranges every epoch and, for ``learned``, takes their marglik step after the prior's."""
    aug, m = run.augmentation, run.marglik
    if not (aug.wraps_model or (aug.report and m.online)):
        return []
    from laplace_lab.training.augmentation import AugmentationMarglik

    c = run.curvature
    return [AugmentationMarglik(aug.mode == "learned", c.hessian_structure, c.type, m.frequency, m.burnin, aug.lr,
                                aug.lr_min, c.fit_batch_size, c.subset_of_weights == "all")]


def checkpoints(run: RunConfig, output_dir: Path, loop: TrainingLoop) -> list:
    """``checkpoint.enabled``: ``last.ckpt`` rewritten every ``checkpoint.every_n_epochs`` epochs, and
    with ``checkpoint.monitor`` the best checkpoint by it (``best-epoch<N>.ckpt``). Two callbacks:
    Lightning's own ``save_last`` (2.6) rewrites last.ckpt only in an epoch that also saved a top-k
    checkpoint, i.e. never without a monitor (only at the end of training) and only on improvement
    with one, which would leave a cut-off run nothing recent to resume."""
    ck = run.checkpoint
    if not ck.enabled:
        return []
    import pytorch_lightning as pl

    dirpath, every = str(checkpoint_dir(run, output_dir)), ck.every_n_epochs
    callbacks = [pl.callbacks.ModelCheckpoint(dirpath=dirpath, filename="last", every_n_epochs=every, save_top_k=1,
                                              monitor=None, enable_version_counter=False)]
    if ck.monitor:
        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=dirpath, every_n_epochs=every, save_top_k=1, monitor=ck.monitor, mode=ck.mode,
            filename="best-epoch{epoch}", auto_insert_metric_name=False))
    return callbacks


def epoch_eta(run: RunConfig, output_dir: Path, loop: TrainingLoop) -> list:
    """The remaining training time after every epoch (``training.epoch_eta``), in the log and the
    run's ``progress.json``; a ``map_grid`` point, its refit or an ensemble member is named by its
    subfolder."""
    from laplace_lab.training.map_grid import REFIT_NAME

    name = output_dir.name
    label = f"MAP training ({name})" if name.startswith(("grid_", "member_", REFIT_NAME)) else "MAP training"
    cls = loop.training_class(EpochETA)
    return [cls(output_dir if is_first_process() else None, label)]  # DDP: rank 0 writes progress.json
