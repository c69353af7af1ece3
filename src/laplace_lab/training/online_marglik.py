"""Online marginal-likelihood hyperparameter optimisation (Immer et al. 2021, Algorithm 1).

Every ``frequency`` epochs after ``burnin`` epochs, at the end of a training epoch: fit a
Laplace approximation at the current weights on the training data, then take ``n_steps`` Adam
steps (rate ``lr_hyp``, optional cosine decay to ``lr_hyp_min`` over the run's hyper steps) on
the negative log marginal likelihood w.r.t. the log prior precisions and, for regression, the
log noise std. The new values go straight into the module's buffers, so the next training
step's loss uses them.

Temperature convention: the training loss is ``NLL / T + prior / N`` per datum and the Laplace
posterior precision is ``H / (sigma^2 T) + P0``; both use the module's ``temperature``.

Cost of the K hyper steps: for kron and diag fits each step uses ``EigenMarglik``'s closed-form
gradient (eigenvalues taken once per fit, O(P) per step, no autograd; full fits: ``FullMarglik``,
one Cholesky per step) and a functional Adam update, so K = 100 steps take tens of milliseconds on LeNet-5 (they took ~0.3 s, a third of a
training epoch, through ``Laplace.log_marginal_likelihood`` + autograd + ``Adam.step``).

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
import warnings
from typing import TYPE_CHECKING

import torch
from torch import nn

from laplace_lab.laplace import Laplace, eigen_marglik
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


def warn_rejected(rejected: int, n_steps: int, epoch: int) -> None:
    """A loud warning when more than half of one marglik phase's ``n_steps`` hyper steps were rejected."""
    if rejected > n_steps / 2:
        log.warning("!!! online marglik at epoch %d: %d of %d hyper steps REJECTED (non-finite marglik or gradient): "
                    "the hyperparameters barely moved; training may be diverging (lower optimizer.lr or "
                    "marglik.lr_hyp) !!!", epoch, rejected, n_steps)


def _all_finite(tensors) -> bool:
    """One check (one host sync on an accelerator) for a few small tensors."""
    return bool(torch.isfinite(torch.cat([t.detach().reshape(-1) for t in tensors])).all())


def _snapshot_state(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[dict | None]:
    """Copies of the optimiser's per-parameter state (tensors cloned)."""
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
            if p in opt.state else None for p in params]


def _restore_state(opt: torch.optim.Optimizer, params: list[torch.Tensor], saved: list[dict | None]) -> None:
    for p, s in zip(params, saved):
        if s is None:
            opt.state.pop(p, None)
        else:
            opt.state[p] = s


def _adam_step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()`` for a plain ``torch.optim.Adam`` through the functional ``torch.optim.adam.adam``
    (same update, same state layout). ``Adam.step`` checks for an accelerator on every call, which
    under Lightning (``PYTORCH_NVML_BASED_CUDA_CHECK=1``) loads NVML each time: ~0.4 ms, ten times the
    update of a few log hyperparameters. Anything but a plain Adam group falls back to ``opt.step()``."""
    from torch.optim.adam import adam

    if type(opt) is not torch.optim.Adam or any(
            g.get("fused") or g.get("capturable") or g.get("differentiable") or g.get("foreach")
            for g in opt.param_groups):
        opt.step()
        return
    with torch.no_grad():
        for g in opt.param_groups:
            ps = [p for p in g["params"] if p.grad is not None]
            for p in ps:
                st = opt.state[p]
                if len(st) == 0:  # as Adam._init_group (capturable / fused off)
                    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                    st["step"] = torch.tensor(0.0, dtype=scalar)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if g["amsgrad"]:
                        st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if not ps:
                continue
            sts = [opt.state[p] for p in ps]
            extra = {"decoupled_weight_decay": g["decoupled_weight_decay"]} if "decoupled_weight_decay" in g else {}
            adam(ps, [p.grad for p in ps], [st["exp_avg"] for st in sts], [st["exp_avg_sq"] for st in sts],
                 [st["max_exp_avg_sq"] for st in sts] if g["amsgrad"] else [], [st["step"] for st in sts],
                 foreach=False, fused=False, capturable=False, differentiable=False, amsgrad=g["amsgrad"],
                 beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"], weight_decay=g["weight_decay"],
                 eps=g["eps"], maximize=g["maximize"], **extra)


def marglik_epochs(max_epochs: int, burnin: int, frequency: int) -> list[int]:
    """1-based epochs after which a marglik step runs: ``e >= burnin`` and ``(e - burnin) % F == 0``."""
    return [e for e in range(1, max_epochs + 1) if e >= max(burnin, 1) and (e - burnin) % frequency == 0]


class OnlineMarglikCore:
    """Algorithm 1 as Lightning callback hooks (``trainer``: Lightning's Trainer or the plain loop's
    state, ``training.plain_loop``); ``OnlineMarglik`` is this class as a Lightning ``Callback``
    (``training.lightning_classes``). See the module docstring for conventions.

    Args:
        laplace_kwargs: ``subset_of_weights``, ``hessian_structure``, ``curvature``,
            ``n_mc_samples`` passed to ``Laplace``.
        prior_structure: ``scalar`` | ``layerwise`` | ``diagonal`` | ``normgroups``.
        frequency, n_steps, burnin: F, K, B of Algorithm 1.
        lr_hyp, lr_hyp_min: Adam rate and the cosine schedule's final rate (``None``: constant).
        optimize_sigma: also learn the noise std (regression only).
        early_stopping: restore the best-marglik weights and hyperparameters at the end.
        log_min, log_max: clamp range of every log hyperparameter.
        fit_batch_size: batch size of the Laplace fit's data pass (``None``: training batch size).
        fused: accumulate the curvature during the training steps (no extra data pass).
    """

    def __init__(self, laplace_kwargs: dict, prior_structure: str = "layerwise", frequency: int = 1,
                 n_steps: int = 100, burnin: int = 0, lr_hyp: float = 0.1, lr_hyp_min: float | None = None,
                 optimize_sigma: bool = True, early_stopping: bool = True, log_min: float = -12.0,
                 log_max: float = 12.0, fit_batch_size: int | None = None, fused: bool = False):
        super().__init__()
        if prior_structure not in PRIOR_STRUCTURES:
            raise ValueError(f"prior.structure={prior_structure!r}; allowed: {list(PRIOR_STRUCTURES)}")
        if frequency < 1 or n_steps < 1 or burnin < 0:
            raise ValueError("marglik.frequency >= 1, marglik.n_steps >= 1 and marglik.burnin >= 0 are required")
        self.laplace_kwargs = dict(laplace_kwargs)
        self.prior_structure = prior_structure
        self.frequency, self.n_steps, self.burnin = frequency, n_steps, burnin
        self.lr_hyp, self.lr_hyp_min = lr_hyp, lr_hyp_min
        self.optimize_sigma = optimize_sigma
        self.early_stopping = early_stopping
        self.log_min, self.log_max = log_min, log_max
        self.fit_batch_size = fit_batch_size
        self.fused = fused
        self._fused = None  # the FusedCurvature of the current accumulation epoch
        self._fused_time = 0.0
        self.log_prior: torch.Tensor | None = None
        self.log_sigma: torch.Tensor | None = None
        self.hyper_optimizer: torch.optim.Adam | None = None
        self.hyper_steps_done = 0
        self.n_rejected = 0
        self.best_marglik = -math.inf
        self.best_state: dict | None = None
        self.history: list[dict] = []

    # --- setup ------------------------------------------------------------------------------
    def _make_laplace(self, module: MAPModule) -> Laplace:
        x = None
        if self.prior_structure == "normgroups":  # trace the group detection on a zero input
            x = example_input(getattr(module.trainer.datamodule, "input_shape", None), module.model)
        return Laplace(
            module.model, module.likelihood, prior_precision=1.0, prior_structure=self.prior_structure,
            temperature=module.temperature, seed=self.hyper_steps_done, example_input=x, **self.laplace_kwargs,
        )

    def _init_hyperparameters(self, module: MAPModule, la: Laplace) -> None:
        device = module.prior_precision.device
        self.log_prior = initial_log_prior(module.prior_precision, module.model, la.params, self.prior_structure,
                                           groups=la.prior_groups)
        self.log_prior = self.log_prior.detach().to(device).requires_grad_(True)
        params = [self.log_prior]
        if self.optimize_sigma and module.likelihood == "regression":
            self.log_sigma = module.log_sigma_noise.detach().clone().requires_grad_(True)
            params.append(self.log_sigma)
        self.hyper_optimizer = torch.optim.Adam(params, lr=self.lr_hyp)

    def _total_hyper_steps(self, trainer: pl.Trainer) -> int:
        return self.n_steps * max(len(marglik_epochs(trainer.max_epochs, self.burnin, self.frequency)), 1)

    def _lr(self, trainer: pl.Trainer, total: int | None = None) -> float:
        if self.lr_hyp_min is None:
            return self.lr_hyp
        total = self._total_hyper_steps(trainer) if total is None else total
        progress = min(self.hyper_steps_done / total, 1.0)
        return self.lr_hyp_min + 0.5 * (self.lr_hyp - self.lr_hyp_min) * (1 + math.cos(math.pi * progress))

    # --- fused accumulation ------------------------------------------------------------------
    def _is_marglik_epoch(self, trainer: pl.Trainer) -> bool:
        return trainer.current_epoch + 1 in marglik_epochs(trainer.max_epochs, self.burnin, self.frequency)

    def on_fit_start(self, trainer: pl.Trainer, module: MAPModule) -> None:
        """Reject fused mode on networks with BatchNorm before any training: its train-mode batch
        statistics couple the samples (no per-sample gradients to accumulate)."""
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
            la.fit(trainer.datamodule.train_eval_dataloader(batch_size=self.fit_batch_size))
        if self.log_prior is None:
            self._init_hyperparameters(module, la)
        fit_time = time.perf_counter() - start
        rejected_before = self.n_rejected
        marglik = self._hyper_steps(trainer, la)
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

    def _hyper_steps(self, trainer: pl.Trainer, la: Laplace) -> float:
        """K Adam steps on -log marglik; returns the log marglik at the final values.

        kron / diag fits: each step takes the closed-form gradient of ``EigenMarglik`` (eigenvalues
        once per fit; one reciprocal and a few sums over the ``[P]`` eigenvalues, no autograd), so
        K = 100 steps take milliseconds; a step is rejected if that gradient is not finite (the
        value is then finite too: logs of positive finite numbers). Full fits take ``FullMarglik``'s
        closed-form gradient (one Cholesky per step, no autograd; a step whose Cholesky fails is
        rejected). Other structures evaluate and
        back-propagate ``la.log_marginal_likelihood`` every step and reject non-finite values or
        gradients, or a step whose evaluation raises ``torch.linalg.LinAlgError`` (an indefinite
        precision). The optimiser state is snapshotted by cloning its (tiny) tensors."""
        params = [p for p in (self.log_prior, self.log_sigma) if p is not None]
        fast = self._eigen_marglik(la)
        opt = self.hyper_optimizer
        total = self._total_hyper_steps(trainer)
        for _ in range(self.n_steps):
            lr = self._lr(trainer, total)
            for group in opt.param_groups:
                group["lr"] = lr
            for p in params:
                p.grad = None
            if fast is not None:
                try:
                    g_prior, g_sigma = fast.grad_log(self.log_prior, self.log_sigma)
                    self.log_prior.grad = -g_prior
                    if self.log_sigma is not None:
                        self.log_sigma.grad = -g_sigma
                    checks = [p.grad for p in params]
                except torch.linalg.LinAlgError:  # full: Cholesky of an indefinite precision: reject
                    checks = None
            else:
                try:
                    neg = -self._marglik(la)
                    neg.backward()
                    checks = None if any(p.grad is None for p in params) else [neg, *(p.grad for p in params)]
                except torch.linalg.LinAlgError:  # e.g. Cholesky of an indefinite precision: reject
                    checks = None
            if checks is None or not _all_finite(checks):
                self.n_rejected += 1
                continue
            saved = [p.detach().clone() for p in params]
            saved_state = _snapshot_state(opt, params)
            _adam_step(opt)
            with torch.no_grad():
                for p in params:
                    p.clamp_(self.log_min, self.log_max)
                if not _all_finite(params):
                    for p, s in zip(params, saved):
                        p.copy_(s)
                    _restore_state(opt, params, saved_state)
                    self.n_rejected += 1
                    continue
            self.hyper_steps_done += 1
        with torch.no_grad():
            try:
                return float(self._marglik(la))
            except torch.linalg.LinAlgError:
                return float("nan")

    def _eigen_marglik(self, la: Laplace):
        """``EigenMarglik(la)`` for kron / diag fits, ``FullMarglik(la)`` for full ones, else ``None``
        (also, with a warning, if it does not reproduce ``la.log_marginal_likelihood``: an engine
        convention it does not know)."""
        try:
            return eigen_marglik.closed_form(la)
        except ValueError as err:
            warnings.warn(f"online marglik: falling back to Laplace.log_marginal_likelihood ({err})", stacklevel=2)
            return None

    def _marglik(self, la: Laplace) -> torch.Tensor:
        dtype = la.mean.dtype
        sigma = self.log_sigma.to(dtype).exp() if self.log_sigma is not None else None
        return la.log_marginal_likelihood(prior_precision=self.log_prior.to(dtype).exp(), sigma_noise=sigma)

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
        prior = self.log_prior.detach().exp()
        if self.prior_structure == "normgroups":  # per subset tensor: its group's precision
            prior = prior[la.prior_groups.to(prior.device)]
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
    def state_dict(self) -> dict:
        return {
            "log_prior": None if self.log_prior is None else self.log_prior.detach().clone(),
            "log_sigma": None if self.log_sigma is None else self.log_sigma.detach().clone(),
            "hyper_optimizer": None if self.hyper_optimizer is None else self.hyper_optimizer.state_dict(),
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
            self.log_prior = state["log_prior"].clone().requires_grad_(True)
            params = [self.log_prior]
            if state["log_sigma"] is not None:
                self.log_sigma = state["log_sigma"].clone().requires_grad_(True)
                params.append(self.log_sigma)
            self.hyper_optimizer = torch.optim.Adam(params, lr=self.lr_hyp)
            self.hyper_optimizer.load_state_dict(state["hyper_optimizer"])


def __getattr__(name: str):
    """``OnlineMarglik`` (the Lightning callback) on first use: importing Lightning costs seconds."""
    if name == "OnlineMarglik":
        from laplace_lab.training.lightning_classes import OnlineMarglik

        return OnlineMarglik
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
