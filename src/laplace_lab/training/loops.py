"""The two training loops as classes: what each one does differently from the other.

``training.loop_choice.choose_loop`` picks one per run (``trainer.loop``: auto | lightning | plain);
everything downstream calls its methods instead of comparing the loop's name:

- ``seed``: the run's seeds (Lightning's ``seed_everything`` with worker seeds, or the plain loop's);
- ``training_class``: the class that runs a core class (``MAPCore``, ``OnlineMarglikCore``,
  ``EpochETA``): the class itself, or its Lightning twin (``lightning_classes.lightning_twin``);
- ``lightning``: whether it runs under Lightning (its loggers must be Lightning's:
  ``reporting.run_loggers.build_loggers``);
- ``make_trainer``: the class ``trainer._target_`` names (Lightning's ``Trainer``) from the other
  ``trainer.*`` options but ``loop``, or ``PlainTrainer``, its stand-in, from the same options;
- ``fit``: train, resuming from a checkpoint where one is given (Lightning only);
- ``root_device``: the device the trained network lives on.

``PLAIN`` and ``LIGHTNING`` are the loops' instances; ``str(loop)`` is the loop's name. The plain loop
never imports Lightning.
"""

from __future__ import annotations

from pathlib import Path

import torch

from laplace_lab.config.schema import RunConfig
from laplace_lab.io.eta import attached_to_terminal
from laplace_lab.training.plain_loop import PlainTrainer, resolve_device, seed_everything


class TrainingLoop:
    """One way of training the MAP network; ``name`` is its ``trainer.loop`` value."""

    name = ""
    lightning = False

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def seed(self, seed: int) -> None:
        raise NotImplementedError

    def training_class(self, cls: type) -> type:
        """The class this loop runs for the core class ``cls``."""
        raise NotImplementedError

    def make_trainer(self, run: RunConfig, output_dir: Path, loggers: list, callbacks: list):
        raise NotImplementedError

    def fit(self, trainer, module, datamodule, resume: str | None) -> None:
        raise NotImplementedError

    def root_device(self, trainer) -> torch.device:
        raise NotImplementedError


def _progress_bar(run: RunConfig) -> bool:
    """Progress bars only on a terminal (epoch lines, ``training.epoch_eta``, otherwise)."""
    return run.trainer.enable_progress_bar and attached_to_terminal()


class PlainLoop(TrainingLoop):
    """``training.plain_loop``: the core classes as they are, no Lightning (``loop_choice`` says which runs qualify)."""

    name = "plain"

    def seed(self, seed: int) -> None:
        seed_everything(seed)

    def training_class(self, cls: type) -> type:
        return cls

    def make_trainer(self, run: RunConfig, output_dir: Path, loggers: list, callbacks: list) -> PlainTrainer:
        t = run.trainer
        return PlainTrainer(t.max_epochs, resolve_device(t.accelerator), loggers, callbacks,
                            log_every_n_steps=t.log_every_n_steps, enable_progress_bar=_progress_bar(run),
                            check_val_every_n_epoch=t.extra.get("check_val_every_n_epoch", 1))

    def fit(self, trainer, module, datamodule, resume: str | None) -> None:
        if resume:  # loop_choice never picks the plain loop for a run with checkpoints
            raise ValueError(f"the plain loop cannot resume from a checkpoint ({resume}); allowed: trainer.loop=lightning")
        trainer.fit(module, datamodule)

    def root_device(self, trainer) -> torch.device:
        return trainer.root_device


class LightningLoop(TrainingLoop):
    """``pytorch_lightning.Trainer``: the core classes' Lightning twins, every Lightning feature."""

    name = "lightning"
    lightning = True

    def seed(self, seed: int) -> None:
        import pytorch_lightning as pl

        pl.seed_everything(seed, workers=True)

    def training_class(self, cls: type) -> type:
        from laplace_lab.training.lightning_classes import lightning_twin

        return lightning_twin(cls)

    def make_trainer(self, run: RunConfig, output_dir: Path, loggers: list, callbacks: list):
        from hydra.utils import get_class

        kwargs = {**run.trainer.lightning_kwargs(), "enable_progress_bar": _progress_bar(run)}
        return get_class(run.trainer._target_)(**kwargs, logger=loggers, default_root_dir=str(output_dir),
                                               callbacks=callbacks, enable_checkpointing=run.checkpoint.enabled)

    def fit(self, trainer, module, datamodule, resume: str | None) -> None:
        # (check_resume read the checkpoint with weights_only=True already; Lightning reads it the same way)
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)

    def root_device(self, trainer) -> torch.device:
        return trainer.strategy.root_device


PLAIN, LIGHTNING = PlainLoop(), LightningLoop()
