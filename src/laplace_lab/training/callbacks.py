"""The training callbacks of a run, built in order from the ``callbacks`` config (``conf/callbacks/``)
by ``training.fit.build_callbacks``, whose entries name by ``_target_`` either

- a callback class with typed options (``options_type``, a dataclass; ``OnlineMarglikCore``,
  ``AugmentationMarglikCore``): ``options_type.from_run(run)`` reads its options from the run's typed
  config (``None``: the run does not use it) and the class is built with them, ``cls(options)``;
  the class ``loop`` runs for it (``training.loops``: its Lightning twin under Lightning), or
- a function ``(run, output_dir, loop) -> list`` for what depends on the run folder (``checkpoints``,
  ``epoch_eta`` below), returning an empty list where the run does not use it.

The result holds the classes ``loop`` runs: Lightning callbacks, or the plain loop's hook objects. Lightning is imported only where a Lightning callback is built.
"""

from __future__ import annotations

from pathlib import Path

from laplace_lab.config.schema import RunConfig
from laplace_lab.sweeps.ranks import is_first_process
from laplace_lab.training.epoch_eta import EpochETA
from laplace_lab.training.loops import TrainingLoop
from laplace_lab.training.resume import checkpoint_dir


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
