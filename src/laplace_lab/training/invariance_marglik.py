"""Invariance learning by the marglik: the ``augmentation/`` config group wraps the network in ``AugmentedModel`` and learn the
augmentation ranges ``eta`` by the Laplace marglik during training (Immer, van der Ouderaa et
al. 2022), next to the online marglik's prior precisions.

Modes: ``none`` (the plain network), ``fixed`` (``init`` ranges, never changed), ``learned``
(``AugmentationMarglikCore`` takes one Adam step on ``-log marglik`` w.r.t. the ``learnable`` ranges in
every marglik epoch of the online schedule, after ``OnlineMarglik`` updated the prior). The
gradient comes from one training batch (``differentiable_marglik.log_marglik`` with ``full``: the
value is the full-data marglik), as in the authors' code (one partial fit per epoch,
``n_hypersteps = 1``); the rate follows a cosine from ``lr`` to ``lr_min`` over the marglik epochs.
``OnlineMarglik``'s prior step fits its ``Laplace`` with the same curvature of the averaged model
(``online_marglik.fit_for_marglik``), so both steps optimise one marglik, and the eta step reuses
that fit's full-data factors (same weights and eta) instead of a second data pass.

Every epoch the current ranges are logged as ``augmentation/<name>`` (csv/metrics.csv); at the end
of training ``figures/augmentation_eta.png`` shows them over the epochs. ``AugmentationMarglik`` is
the core class as a Lightning ``Callback`` (``training.lightning_classes``; the augmentation runs
under Lightning's Trainer only, ``training.loop_choice``); this module imports no Lightning.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from laplace_lab import lazy_attributes
from laplace_lab.config.schema import FIT_BATCH_AUTO, AugmentationConfig, MarglikConfig, RunConfig
from laplace_lab.laplace import differentiable_marglik as dm
from laplace_lab.laplace.marglik_schedule import is_marglik_epoch, marglik_epochs
from laplace_lab.models.augmentation import TRANSFORMS, AffineAugmentation, AugmentedModel

if TYPE_CHECKING:  # annotations only
    import pytorch_lightning as pl

log = logging.getLogger(__name__)
MODES = ("none", "fixed", "learned")


def wrap_model(aug: AugmentationConfig, net: torch.nn.Module) -> torch.nn.Module:
    """``net`` itself (mode none) or ``AugmentedModel(net, AffineAugmentation(...))``."""
    if not aug.wraps_model:
        return net
    learnable = list(aug.learnable) if aug.mode == "learned" else []
    return AugmentedModel(net, AffineAugmentation(int(aug.n_samples), dict(aug.init), learnable, aug.interpolation))


@dataclass(frozen=True)
class AugmentationMarglikOptions:
    """The options of ``AugmentationMarglikCore``.

    Args:
        learn: optimise the learnable ranges (mode learned) or only log them (mode fixed).
        structure, curvature_type: ``differentiable_marglik`` options (``kron`` | ``diag``, ``ggn`` | ``ef``).
        frequency, burnin: the online marglik's F and B (same epochs).
        lr, lr_min: Adam rate on eta, cosine-decayed to ``lr_min`` over the marglik epochs.
        fit_batch_size: batch size of the graph-free full-data pass (``None``: the data module's).
        subset_all: the curvature covers all weights (else no final ``augmentation/log_marglik``).
    """

    learn: bool
    structure: str = "kron"
    curvature_type: str = "ggn"
    frequency: int = MarglikConfig.frequency
    burnin: int = MarglikConfig.burnin
    lr: float = AugmentationConfig.lr
    lr_min: float = AugmentationConfig.lr_min
    fit_batch_size: int | None = None
    subset_all: bool = True

    @classmethod
    def from_run(cls, run: RunConfig) -> AugmentationMarglikOptions | None:
        """From the run's ``augmentation``, ``marglik`` and ``curvature`` groups; ``None`` unless
        ``augmentation=fixed|learned`` (or ``none`` with ``report=true`` under online marglik)."""
        aug, m, c = run.augmentation, run.marglik, run.curvature
        if not (aug.wraps_model or (aug.report and m.online)):
            return None
        fit_batch = c.fit_batch_size
        if fit_batch == FIT_BATCH_AUTO:  # its differentiable fit (differentiable_marglik) declares no memory plan
            log.info("curvature.fit_batch_size=auto: the augmentation marglik's full-data pass has no memory "
                     "plan; it runs at data.eval_batch_size")
            fit_batch = None
        return cls(aug.mode == "learned", c.hessian_structure, c.type, m.frequency, m.burnin, aug.lr, aug.lr_min,
                   fit_batch, c.subset_of_weights == "all")


class AugmentationMarglikCore:
    """Logs ``eta`` every epoch; with ``options.learn`` also takes its marglik step (module docstring)."""

    options_type = AugmentationMarglikOptions

    def __init__(self, options: AugmentationMarglikOptions):
        super().__init__()
        o = self.options = options
        self.subset_all = o.subset_all
        self.learn, self.structure, self.curvature_type = o.learn, o.structure, o.curvature_type
        self.frequency, self.burnin = o.frequency, o.burnin
        self.lr, self.lr_min, self.fit_batch_size = o.lr, o.lr_min, o.fit_batch_size
        self.eta: torch.Tensor | None = None
        self.optimizer: torch.optim.Adam | None = None
        self.steps_done = 0
        self.history: list[dict] = []

    def _lr(self, total: int) -> float:
        progress = min(self.steps_done / max(total, 1), 1.0)
        return self.lr_min + 0.5 * (self.lr - self.lr_min) * (1 + math.cos(math.pi * progress))

    def _step(self, trainer: pl.Trainer, module) -> float:
        model = module.model
        aug = model.augmentation
        if self.eta is None:
            self.eta = aug.eta.detach().clone().requires_grad_(True)
            self.optimizer = torch.optim.Adam([self.eta], lr=self.lr)
        dmod = trainer.datamodule
        lik = module.likelihood
        was_training = model.training
        model.eval()
        full = _online_factors(trainer, self.structure, self.curvature_type)  # the prior step's fit, same weights
        if full is None:
            full = dm.fit_factors(model, dmod.train_eval_dataloader(batch_size=self.fit_batch_size), self.structure,
                                  self.curvature_type, lik)
        X, y = next(iter(dmod.train_dataloader()))  # a shuffled training batch: the partial fit
        X, y = X.to(aug.eta.device), y.to(aug.eta.device)
        prior = module.prior_precision.detach().to(aug.eta.dtype)
        total = len(marglik_epochs(trainer.max_epochs, self.burnin, self.frequency))
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr(total)
        self.optimizer.zero_grad()
        marglik = dm.log_marglik(model, X, y, self.eta, prior, self.structure, self.curvature_type, lik,
                                 temperature=module.temperature, full=full)
        (-marglik).backward()
        if torch.isfinite(self.eta.grad).all():
            self.optimizer.step()
        self.steps_done += 1
        with torch.no_grad():
            aug.eta.copy_(torch.where(aug.learnable, self.eta, aug.eta))
        model.train(was_training)
        return float(marglik.detach())

    def on_train_epoch_end(self, trainer: pl.Trainer, module) -> None:
        values = {}
        if self.learn and is_marglik_epoch(trainer.current_epoch + 1, trainer.max_epochs, self.burnin, self.frequency):
            values["augmentation/log_marglik"] = self._step(trainer, module)
        values.update(_ranges(module.model))
        self.history.append({"epoch": trainer.current_epoch + 1, **values})
        module.log_dict(values, on_step=False, on_epoch=True)

    def on_train_end(self, trainer: pl.Trainer, module) -> None:
        # OnlineMarglik's early stopping (called before this callback) may have restored an earlier
        # eta with the best-marglik weights: the final ranges are read from the model
        self._final = _ranges(module.model)
        online = [cb for cb in trainer.callbacks if hasattr(cb, "best_marglik") and hasattr(cb, "history")]
        if online and online[0].history:
            best = online[0].best_marglik
            self._final["marglik/best_log_marglik"] = best if math.isfinite(best) else online[0].history[-1][
                "marglik/log_marglik"]
        if self.structure in dm.STRUCTURES and self.curvature_type in dm.CURVATURE_TYPES and self.subset_all:
            self._final["augmentation/log_marglik"] = self._final_marglik(trainer, module)
        if self.history:
            plot_eta(self.history, Path(trainer.default_root_dir) / "figures" / "augmentation_eta.png")

    def _final_marglik(self, trainer: pl.Trainer, module) -> float:
        """Full-data log marglik of the final network with ``differentiable_marglik``'s curvature (the
        reduce KFAC of the averaged model; a plain network is wrapped with ``S = 1``, ``eta = 0``),
        comparable across the none / fixed / learned rows (``OnlineMarglik``'s best value uses the same
        curvature, ``fit_for_marglik``, at the restored epoch's eta draws)."""
        model = module.model
        if not isinstance(model, AugmentedModel):
            p = next(model.parameters())
            model = AugmentedModel(model, AffineAugmentation(1)).to(device=p.device, dtype=p.dtype)
        was_training = model.training
        model.eval()
        fac = dm.fit_factors(model, trainer.datamodule.train_eval_dataloader(batch_size=self.fit_batch_size),
                             self.structure, self.curvature_type, module.likelihood)  # graph-free
        value = dm.log_marglik_from_factors(model, fac, module.prior_precision.detach().to(p_dtype(model)),
                                            self.structure, module.temperature, module.likelihood)
        model.train(was_training)
        return float(value)

    def final_metrics(self) -> dict[str, float]:
        """``augmentation/<name>`` final ranges, ``augmentation/log_marglik`` (final, this module's
        curvature) and ``marglik/best_log_marglik`` (``OnlineMarglik``'s) for metrics.json."""
        return dict(getattr(self, "_final", {}))

    def state_dict(self) -> dict:
        return {"eta": None if self.eta is None else self.eta.detach().clone(), "steps_done": self.steps_done,
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
                "history": self.history}

    def load_state_dict(self, state: dict) -> None:
        self.steps_done, self.history = state["steps_done"], list(state["history"])
        if state["eta"] is not None:
            self.eta = state["eta"].clone().requires_grad_(True)
            self.optimizer = torch.optim.Adam([self.eta], lr=self.lr)
            self.optimizer.load_state_dict(state["optimizer"])


def _online_factors(trainer: pl.Trainer, structure: str, curvature_type: str) -> dm.Factors | None:
    """This epoch's full-data factors of ``OnlineMarglik``'s prior step (``fit_for_marglik``), if it
    fitted the same structure and curvature at the current weights and eta, else ``None``."""
    for cb in trainer.callbacks:
        la_kwargs = getattr(cb, "laplace_kwargs", None)
        if (getattr(cb, "last_factors", None) is not None and cb.last_factors_epoch == trainer.current_epoch
                and la_kwargs.get("hessian_structure") == structure and la_kwargs.get("curvature") == curvature_type):
            return cb.last_factors
    return None


def p_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _ranges(model) -> dict[str, float]:
    """``{"augmentation/<name>": eta}``; all 0 for a network without augmentation (mode none)."""
    if isinstance(model, AugmentedModel):
        return {f"augmentation/{n}": v for n, v in model.augmentation.ranges().items()}
    return {f"augmentation/{n}": 0.0 for n in TRANSFORMS}


def plot_eta(history: list[dict], path: Path) -> None:
    """One line per transform: ``|eta|`` over the epochs (rotation in degrees on a second axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    epochs = [h["epoch"] for h in history]
    fig, (ax_rot, ax_rest) = plt.subplots(1, 2, figsize=(9, 3.2))
    ax_rot.plot(epochs, [abs(h["augmentation/rotation"]) * 180 / math.pi for h in history])
    ax_rot.set(xlabel="epoch", ylabel="rotation range (degrees)", ylim=(0, 185))
    for n in TRANSFORMS:
        if n != "rotation":
            ax_rest.plot(epochs, [abs(h[f"augmentation/{n}"]) for h in history], label=n)
    ax_rest.set(xlabel="epoch", ylabel="|eta| (normalised units)")
    ax_rest.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ``AugmentationMarglik`` (the Lightning callback) on first use: importing Lightning costs seconds
__getattr__ = lazy_attributes(__name__, {"AugmentationMarglik": "laplace_lab.training.lightning_classes"})
