"""Online marginal-likelihood hyperparameter optimisation (Immer et al. 2021, Algorithm 1).

Every ``frequency`` epochs after ``burnin`` epochs, at the end of a training epoch: fit a
Laplace approximation at the current weights on the training data, then take ``n_steps`` Adam
steps (rate ``lr_hyp``, optional cosine decay to ``lr_hyp_min`` over the run's hyper steps) on
the negative log marginal likelihood w.r.t. the log prior precisions and, for regression, the
log noise std. The new values go straight into the module's buffers, so the next training
step's loss uses them.

Temperature convention: the training loss is ``NLL / T + prior / N`` per datum and the Laplace
posterior precision is ``H / (sigma^2 T) + P0``; both use the module's ``temperature``.

The K hyper steps are ``laplace.hyper.MarglikOptimizer`` steps (the optimiser post-hoc tuning uses
too): the gradient comes from the structure's closed form where it has one (kron, diag: eigenvalues
taken once per fit, O(P) per step, no autograd; full: one Cholesky per step), else autograd through
``Laplace.log_marginal_likelihood``. With a closed form the K steps run in
``MarglikOptimizer.run_closed_form``: no host synchronisation per step (rejections are device-side
masks, the rate schedule a device tensor); the number of accepted steps is read once per phase.

Robustness: a hyper step whose marglik or gradient is not finite is rejected (values and
optimiser state before it are kept), counted and logged; training goes on. Log hyperparameters
are clamped to ``[log_min, log_max]`` (default ``[-12, 12]`` i.e. precisions / sigmas within
``[6e-6, 1.6e5]``) so no step can make the training loss overflow.

Fused mode (``fused=True``; EF or MC-Fisher, kron or diag, all weights): instead of an extra
data pass after the epoch, the curvature is accumulated during the ordinary training steps of
the epoch that ends with a marglik step (``laplace_lab.laplace.fused``). The weights move during
that epoch, so the fused curvature mixes the weights of the whole epoch: an approximation whose
effect on the marglik and the test metrics is measured in ``benchmarks/marglik_overhead.py``.

Early stopping on the marglik (``early_stopping=True``, as in the paper): the weights and
hyperparameters with the best marglik are kept and restored when training ends.
The callback's state (log hyperparameters, Adam state, schedule position, best marglik and
best weights) is saved in Lightning checkpoints, so a resumed run follows the same trajectory.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from laplace_lab import lazy_attributes
from laplace_lab.config.schema import FIT_BATCH_AUTO, RunConfig
from laplace_lab.config.schema import MarglikConfig as M  # the options' defaults, declared once
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.distributed import ShardBatches
from laplace_lab.laplace.hyper import MarglikOptimizer
from laplace_lab.laplace.marglik_schedule import is_marglik_epoch, marglik_epochs  # noqa: F401 (re-exported)
from laplace_lab.training.fit_batch import fit_batch_size
from laplace_lab.training.hyperparameters import (
    PRIOR_STRUCTURES,
    example_input,
    initial_log_prior,
    subset_tensor_indices,
    write_prior,
)

if TYPE_CHECKING:  # annotations only: Lightning is imported where a Lightning Trainer runs
    import pytorch_lightning as pl

    from laplace_lab.training.module import MAPModule

log = logging.getLogger(__name__)


def _world_size(trainer) -> int:
    """The number of training processes (Lightning DDP), 1 for the plain loop or without a trainer."""
    return int(getattr(trainer, "world_size", 1) or 1)


def warn_rejected(rejected: int, n_steps: int, epoch: int) -> None:
    """A loud warning when more than half of one marglik phase's ``n_steps`` hyper steps were rejected."""
    if rejected > n_steps / 2:
        log.warning("!!! online marglik at epoch %d: %d of %d hyper steps REJECTED (non-finite marglik or gradient): "
                    "the hyperparameters barely moved; training may be diverging (lower optimizer.lr or "
                    "marglik.lr_hyp) !!!", epoch, rejected, n_steps)


def fit_for_marglik(la: Laplace, module: MAPModule, loader):
    """Fit ``la`` on ``loader``; returns ``None``, or for an ``AugmentedModel`` (``augmentation/``) the
    full-data ``Factors`` of ``differentiable_marglik.fit_laplace``, which fits ``la`` with the
    averaged model's curvature (the reduce KFAC of the eta step) instead of the engine's KFAC of the
    ``N S`` augmented rows (``1 / S`` of it at ``eta = 0``)."""
    from laplace_lab.models.augmentation import AugmentedModel

    if not isinstance(module.model, AugmentedModel):
        la.fit(loader)
        return None
    from laplace_lab.laplace import differentiable_marglik

    return differentiable_marglik.fit_laplace(la, module.model, loader, module.likelihood)


# the options ``OnlineMarglikOptions.from_run`` takes from the ``marglik`` group as they are
FROM_MARGLIK = ("frequency", "n_steps", "burnin", "lr_hyp", "lr_hyp_min", "optimize_sigma", "early_stopping",
                "log_min", "log_max", "fused")


@dataclass(frozen=True)
class OnlineMarglikOptions:
    """The options of ``OnlineMarglikCore``, checked when built (``ValueError`` naming the option).

    Args:
        laplace_kwargs: ``subset_of_weights``, ``hessian_structure``, ``curvature``,
            ``n_mc_samples`` passed to ``Laplace`` (``CurvatureConfig.laplace_kwargs``).
        prior_structure: ``scalar`` | ``layerwise`` | ``diagonal`` | ``normgroups``.
        frequency, n_steps, burnin: F, K, B of Algorithm 1.
        lr_hyp, lr_hyp_min: Adam rate and the cosine schedule's final rate (``None``: constant).
        optimize_sigma: also learn the noise std (regression only).
        early_stopping: restore the best-marglik weights and hyperparameters at the end.
        log_min, log_max: clamp range of every log hyperparameter.
        fit_batch_size: batch size of the Laplace fit's data pass (``None``: ``data.eval_batch_size``;
            ``"auto"``: ``training.fit_batch.fit_batch_size``, chosen at the first fit and kept).
        fused: accumulate the curvature during the training steps (no extra data pass).
    """

    laplace_kwargs: dict
    prior_structure: str = "layerwise"
    frequency: int = M.frequency
    n_steps: int = M.n_steps
    burnin: int = M.burnin
    lr_hyp: float = M.lr_hyp
    lr_hyp_min: float | None = M.lr_hyp_min
    optimize_sigma: bool = M.optimize_sigma
    early_stopping: bool = M.early_stopping
    log_min: float = M.log_min
    log_max: float = M.log_max
    fit_batch_size: int | str | None = None
    fused: bool = M.fused

    def __post_init__(self):
        if self.prior_structure not in PRIOR_STRUCTURES:
            raise ValueError(f"prior.structure={self.prior_structure!r}; allowed: {list(PRIOR_STRUCTURES)}")
        if self.frequency < 1 or self.n_steps < 1 or self.burnin < 0:
            raise ValueError("marglik.frequency >= 1, marglik.n_steps >= 1 and marglik.burnin >= 0 are required")

    @classmethod
    def from_run(cls, run: RunConfig) -> OnlineMarglikOptions | None:
        """From the run's ``marglik``, ``curvature`` and ``prior`` groups; ``None`` unless ``marglik=online``."""
        m = run.marglik
        if not m.online:
            return None
        return cls(run.curvature.laplace_kwargs(), prior_structure=run.prior.structure,
                   fit_batch_size=run.curvature.fit_batch_size, **{k: getattr(m, k) for k in FROM_MARGLIK})


class OnlineMarglikCore:
    """Algorithm 1 as Lightning callback hooks (``trainer``: Lightning's Trainer or the plain loop's
    state, ``training.plain_loop``); ``OnlineMarglik`` is this class as a Lightning ``Callback``
    (``training.lightning_classes``). See the module docstring for conventions; ``options`` are
    ``OnlineMarglikOptions`` (the ``callbacks`` config builds them from the run: ``training.callbacks``).
    """

    options_type = OnlineMarglikOptions

    def __init__(self, options: OnlineMarglikOptions):
        super().__init__()
        o = self.options = options
        self.laplace_kwargs = dict(o.laplace_kwargs)
        self.prior_structure = o.prior_structure
        self.frequency, self.n_steps, self.burnin = o.frequency, o.n_steps, o.burnin
        self.lr_hyp, self.lr_hyp_min = o.lr_hyp, o.lr_hyp_min
        self.optimize_sigma = o.optimize_sigma
        self.early_stopping = o.early_stopping
        self.log_min, self.log_max = o.log_min, o.log_max
        self.fit_batch_size = o.fit_batch_size
        self.fused = o.fused
        self._fused = None  # the FusedCurvature of the current accumulation epoch
        self._fused_time = 0.0
        self._world = 1  # training processes (Lightning DDP's world size), set by on_fit_start
        self.hyper: MarglikOptimizer | None = None  # created at the first marglik step
        self.hyper_steps_done = 0
        self.n_rejected = 0
        self.best_marglik = -math.inf
        self.best_state: dict | None = None
        self.history: list[dict] = []
        self.last_factors, self.last_factors_epoch = None, None  # augmented models: the last fit's factors

    # --- setup ------------------------------------------------------------------------------
    def _make_laplace(self, module: MAPModule) -> Laplace:
        x = None
        if self.prior_structure == "normgroups":  # trace the group detection on a zero input
            x = example_input(getattr(module.trainer.datamodule, "input_shape", None), module.model)
        return Laplace(
            module.model, module.likelihood, prior_precision=1.0, prior_structure=self.prior_structure,
            temperature=module.temperature, seed=self.hyper_steps_done, example_input=x, **self.laplace_kwargs,
            # several processes (Lightning DDP): the fit loader is this rank's shard, summed over the ranks
            process_group="auto" if self._world > 1 else None,
        )

    @property
    def log_prior(self) -> torch.Tensor | None:
        """The log prior precisions being learnt (``None`` before the first marglik step)."""
        return None if self.hyper is None else self.hyper.log_prior

    @property
    def log_sigma(self) -> torch.Tensor | None:
        return None if self.hyper is None else self.hyper.log_sigma

    def init_hyperparameters(self, module: MAPModule, la: Laplace) -> None:
        device = module.prior_precision.device
        log_prior = initial_log_prior(module.prior_precision, module.model, la.params, self.prior_structure,
                                      groups=la.prior_groups)
        log_sigma = None
        if self.optimize_sigma and module.likelihood == "regression":
            log_sigma = module.log_sigma_noise
        self.hyper = MarglikOptimizer(log_prior.detach().to(device), log_sigma, lr=self.lr_hyp,
                                      log_min=self.log_min, log_max=self.log_max)

    def _total_hyper_steps(self, trainer: pl.Trainer) -> int:
        return self.n_steps * max(len(marglik_epochs(trainer.max_epochs, self.burnin, self.frequency)), 1)

    def _lr(self, trainer: pl.Trainer, total: int | None = None) -> float:
        total = self._total_hyper_steps(trainer) if total is None else total
        return self._lr_at(self.hyper_steps_done, total)

    def _lr_at(self, done, total: int):
        """The rate after ``done`` accepted hyper steps of ``total`` (an int, or a float64 device
        tensor inside ``MarglikOptimizer.run_closed_form``: the rate is then a tensor too)."""
        if self.lr_hyp_min is None:
            return self.lr_hyp
        if isinstance(done, torch.Tensor):
            progress = (done / total).clamp(max=1.0)
            return self.lr_hyp_min + 0.5 * (self.lr_hyp - self.lr_hyp_min) * (1 + torch.cos(math.pi * progress))
        progress = min(done / total, 1.0)
        return self.lr_hyp_min + 0.5 * (self.lr_hyp - self.lr_hyp_min) * (1 + math.cos(math.pi * progress))

    # --- fused accumulation ------------------------------------------------------------------
    def _is_marglik_epoch(self, trainer: pl.Trainer) -> bool:
        return is_marglik_epoch(trainer.current_epoch + 1, trainer.max_epochs, self.burnin, self.frequency)

    def on_fit_start(self, trainer: pl.Trainer, module: MAPModule) -> None:
        """Reject fused mode on networks with BatchNorm before any training: its train-mode batch
        statistics couple the samples (no per-sample gradients to accumulate)."""
        self._world = _world_size(trainer)
        if self._world > 1:
            from laplace_lab.models.augmentation import AugmentedModel

            if self.fused or isinstance(module.model, AugmentedModel):
                raise ValueError("online marglik over several processes (Lightning DDP) fits the Laplace on each "
                                 "rank's shard with marglik.fused=false and a plain model; fused mode and "
                                 "augmented models are not supported there")
        norms = [n for n, m in module.model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if self.fused and norms:
            raise ValueError(f"marglik.fused=true does not support BatchNorm layers (found {norms[:3]}); "
                             "allowed for this model: marglik.fused=false")

    def on_train_epoch_start(self, trainer: pl.Trainer, module: MAPModule) -> None:
        if not (self.fused and self._is_marglik_epoch(trainer)):
            return
        from laplace_lab.laplace.fused import FusedCurvature

        self._fused_time = 0.0
        self._fused = FusedCurvature(self._make_laplace(module))
        self._fused.begin()
        module.fused_curvature = self._fused

    def on_after_backward(self, trainer: pl.Trainer, module: MAPModule) -> None:
        if self._fused is not None:
            start = time.perf_counter()
            self._fused.flush()
            self._fused_time += time.perf_counter() - start

    # --- the marglik step ----------------------------------------------------------------------
    def _auto_fit_batch(self, trainer: pl.Trainer, la: Laplace) -> int:
        """``fit_batch_size=auto``'s batch (``training.fit_batch``); over several processes the
        smallest rank's, so that every rank cuts the training set into the same batches."""
        batch = fit_batch_size(FIT_BATCH_AUTO, trainer.datamodule, la)[0]
        if self._world > 1:
            import torch.distributed as dist

            every = [None] * self._world
            dist.all_gather_object(every, batch)
            batch = min(every)
        return batch

    def on_train_epoch_end(self, trainer: pl.Trainer, module: MAPModule) -> None:
        if not self._is_marglik_epoch(trainer):
            return
        start = time.perf_counter()
        if self._fused is not None:
            start -= self._fused_time  # the per-batch accumulation is part of the fit's cost
            self._fused.end()
            la, self._fused, module.fused_curvature = self._fused.la, None, None
        else:
            la = self._make_laplace(module)
            if self.fit_batch_size == FIT_BATCH_AUTO:  # chosen once, at the first fit (its memory is the run's)
                self.fit_batch_size = self._auto_fit_batch(trainer, la)
            loader = trainer.datamodule.train_eval_dataloader(batch_size=self.fit_batch_size)
            if self._world > 1:  # DDP: every rank fits its share of the batches; the engine sums them
                loader = ShardBatches(loader, self._world, trainer.global_rank)
            self.last_factors = fit_for_marglik(la, module, loader)
            self.last_factors_epoch = trainer.current_epoch
        if self.log_prior is None:
            self.init_hyperparameters(module, la)
        if la.device.type == "cuda":  # the fit's kernels finish before its time is read (one sync per phase)
            torch.cuda.synchronize(la.device)
        fit_time = time.perf_counter() - start
        rejected_before = self.n_rejected
        marglik = self.hyper_steps(trainer, la)
        warn_rejected(self.n_rejected - rejected_before, self.n_steps, trainer.current_epoch + 1)
        self._write_back(module, la)
        self._log(trainer, module, la, marglik, fit_time, time.perf_counter() - start)
        if self.early_stopping and marglik > self.best_marglik:
            self.best_marglik = marglik
            self.best_state = {
                "epoch": trainer.current_epoch + 1,
                "model": copy.deepcopy(module.model.state_dict()),
                "prior_precision": module.prior_precision.clone(),
                "log_sigma_noise": module.log_sigma_noise.clone(),
            }

    def hyper_steps(self, trainer: pl.Trainer, la: Laplace) -> float:
        """K ``MarglikOptimizer`` steps (cosine rate schedule) on -log marglik; returns the log
        marglik at the final values (NaN if its evaluation fails)."""
        fast = self.hyper.closed_form(la)
        total = self._total_hyper_steps(trainer)
        if fast is not None:  # on the device, no host synchronisation until the phase ends
            done = self.hyper_steps_done
            accepted = int(self.hyper.run_closed_form(fast, self.n_steps, lr=lambda n: self._lr_at(done + n, total)))
            self.hyper_steps_done += accepted
            self.n_rejected += self.n_steps - accepted
        else:
            for _ in range(self.n_steps):
                self.hyper.set_lr(self._lr(trainer, total))
                if self.hyper.step(la, fast):
                    self.hyper_steps_done += 1
                else:
                    self.n_rejected += 1
        with torch.no_grad():
            try:
                return float(self.hyper.marglik(la))
            except torch.linalg.LinAlgError:
                return float("nan")

    def _write_back(self, module: MAPModule, la: Laplace) -> None:
        module.set_prior_precision(
            write_prior(module.prior_precision, module.model, la.params, self.prior_structure, self.log_prior.exp(),
                        groups=la.prior_groups)
        )
        if self.log_sigma is not None:
            module.set_sigma_noise(self.log_sigma.detach().exp())

    def _log(self, trainer, module, la, marglik, fit_time, total_time) -> None:
        values = {
            "marglik/log_marglik": marglik,
            "marglik/log_marglik_per_datum": marglik / la.n_data,
            "marglik/fit_time_s": fit_time,
            "marglik/time_s": total_time,
            "marglik/rejected_steps": float(self.n_rejected),
            "marglik/sigma_noise": float(module.sigma_noise),
        }
        prior = la.prior.structure_form(self.log_prior.detach().exp())  # normgroups: per subset tensor
        if self.prior_structure == "diagonal":
            values["marglik/prior_precision_mean"] = float(prior.mean())
        else:
            names = [n for n, _ in module.model.named_parameters()]
            idx = subset_tensor_indices(module.model, la.params)
            for j, i in enumerate(idx):
                values[f"marglik/prior_precision/{names[i]}"] = float(prior[0 if prior.numel() == 1 else j])
        self.history.append({"epoch": trainer.current_epoch + 1, **values})
        log.info("Online marglik, epoch %d: fit %.1f s, %d hyper steps (%d rejected so far), log marglik %.6g, "
                 "prior precision mean %.4g, sigma %.4g, %.1f s", trainer.current_epoch + 1, fit_time, self.n_steps,
                 self.n_rejected, marglik, float(prior.mean()), float(module.sigma_noise), total_time)
        module.log_dict(values, on_step=False, on_epoch=True)

    def on_train_end(self, trainer: pl.Trainer, module: MAPModule) -> None:
        if self.n_rejected:
            log.warning("online marglik: %d of %d hyper steps were rejected (non-finite marglik or gradient); "
                        "marglik/rejected_steps in metrics.json", self.n_rejected, self.n_rejected + self.hyper_steps_done)
        if self.early_stopping and self.best_state is not None:
            module.model.load_state_dict(self.best_state["model"])
            module.set_prior_precision(self.best_state["prior_precision"])
            module.log_sigma_noise = self.best_state["log_sigma_noise"].clone()

    # --- checkpointing ----------------------------------------------------------------------------
    def final_metrics(self) -> dict[str, float]:
        """For metrics.json: the hyper steps rejected (non-finite) and accepted over the run."""
        return {"marglik/rejected_steps": float(self.n_rejected), "marglik/accepted_steps": float(self.hyper_steps_done)}

    def state_dict(self) -> dict:
        return {
            "log_prior": None if self.log_prior is None else self.log_prior.detach().clone(),
            "log_sigma": None if self.log_sigma is None else self.log_sigma.detach().clone(),
            "hyper_optimizer": None if self.hyper is None else self.hyper.optimizer.state_dict(),
            "hyper_steps_done": self.hyper_steps_done,
            "n_rejected": self.n_rejected,
            "best_marglik": self.best_marglik,
            "best_state": self.best_state,
            "history": self.history,
        }

    def load_state_dict(self, state: dict) -> None:
        self.hyper_steps_done = state["hyper_steps_done"]
        self.n_rejected = state["n_rejected"]
        self.best_marglik = state["best_marglik"]
        self.best_state = state["best_state"]
        self.history = list(state["history"])
        if state["log_prior"] is not None:
            self.hyper = MarglikOptimizer.from_state_dict(
                {"log_prior": state["log_prior"], "log_sigma": state["log_sigma"], "adam": state["hyper_optimizer"]},
                lr=self.lr_hyp, log_min=self.log_min, log_max=self.log_max)


# ``OnlineMarglik`` (the Lightning callback) on first use: importing Lightning costs seconds
__getattr__ = lazy_attributes(__name__, {"OnlineMarglik": "laplace_lab.training.lightning_classes"})
