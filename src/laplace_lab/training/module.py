"""MAP training with a Gaussian prior whose precisions are buffers: ``MAPCore`` (a plain
``nn.Module`` with the training / evaluation steps, run by ``training.plain_loop``) and
``MAPModule`` (the same class as a Lightning ``LightningModule``, ``training.lightning_classes``;
importing it here imports Lightning).

Training objective (per datum, so it is comparable across dataset sizes):

    loss = ( NLL_sum(batch) / B ) / T  +  0.5 * sum_g delta_g * ||theta_g||^2 / N

with temperature ``T``, training-set size ``N`` and prior precision ``delta_g`` per parameter
tensor ``g`` (or one per parameter for a diagonal prior). ``N * loss`` is the negative log of
``p(D | theta)^(1/T) p(theta)``, whose Hessian is ``H / T + P0`` -- the same convention as the
Laplace engine's posterior precision ``P = H / (sigma^2 T) + P0``. The prior precisions and,
for regression, ``log_sigma_noise`` live in buffers so that online marglik can change them
during training; the optimiser never sees them. The buffers hold the model's floating dtype (a
float64 network learns its prior and noise in float64): the constructor and the setters take it
from the model's parameters, and ``.to(dtype)`` / ``.double()`` move them with the module.
Optimiser weight decay must stay 0: the prior term is the weight decay (``delta = weight_decay * N``
for plain SGD). With ``prior_in_loss=False`` the loss is the NLL term alone (plain MSE /
cross-entropy training, as in laplace-torch's regression example); the prior precision then only
enters a post-hoc Laplace.

Loss scale (``loss_scale``, regression only for ``mse``): ``nll`` is the loss above; ``mse``
multiplies it by ``2 sigma^2 T`` (sigma detached), i.e. ``MSE / B + 2 sigma^2 T prior / N`` plus a
constant, laplace-torch ``marglik_training``'s objective. Both have the same minimiser, but under
Adam they train differently once online marglik moves sigma: with ``nll`` the gradient grows by
``1 / sigma^2`` when sigma shrinks while Adam's second-moment average (beta2 0.999) still holds the
old scale, so the steps are larger until it catches up; with ``mse`` the data term's scale never
moves (measured on UCI: experiments/immer2021_uci/README.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from laplace_lab import lazy_attributes
from laplace_lab.config.validation import check_loss_scale
from laplace_lab.laplace.priors import Prior
from laplace_lab.training.nll import LIKELIHOODS, natural_to_mean_var, summed_nll
from laplace_lab.training.schedules import scheduler_interval

RUN_IDENTITY_KEY = "laplace_lab_run_identity"
# seconds of training before (and including) the epoch a checkpoint saves, summed over the launches
# that resumed one another (``time/fit_s`` of a resumed run counts them all)
FIT_SECONDS_KEY = "laplace_lab_fit_seconds"
# the config and code hashes of the run that wrote a checkpoint (what resume_from=last must match)
RUN_FINGERPRINT_KEY = "laplace_lab_run_fingerprint"
@dataclass(frozen=True)
class MAPOptimisation:
    """How ``MAPCore`` steps its loss: what changes the path of training, not its minimiser.

    Args:
        optimizer: ``params -> torch.optim.Optimizer`` (a Hydra partial).
        lr_scheduler: ``optimizer -> scheduler`` stepped per epoch, a per-step factory
            (``training.schedules``: ``(optimizer, total_steps) -> scheduler``) or ``None``.
        loss_scale: ``nll`` (the per-datum negative log joint) or ``mse`` (regression: that times
            ``2 sigma^2 T``, laplace-torch's scaling; see the module docstring).
        on_nonfinite_loss: ``error`` (raise ``FloatingPointError`` naming epoch and batch) or
            ``skip`` (no update from that batch; counted in ``n_skipped_batches``).

    ``MAPCore`` checks ``loss_scale`` and ``on_nonfinite_loss`` (the first needs the likelihood).
    """

    optimizer: Callable[..., torch.optim.Optimizer]
    lr_scheduler: Callable | None = None
    loss_scale: str = "nll"
    on_nonfinite_loss: str = "error"


class MAPCore(nn.Module):
    """MAP training of ``model`` under ``likelihood`` with a per-tensor Gaussian prior.

    The step hooks follow Lightning's names (``training_step``, ``configure_optimizers``, ...), so
    ``MAPModule`` (``MAPCore`` + ``LightningModule``) runs the same code under Lightning's Trainer.
    Here, without Lightning, ``self._trainer`` is the plain loop's state (``training.plain_loop``)
    and ``log_dict`` hands it the values.

    Args:
        model: the network; ``model(x)`` returns logits ``[B, C]`` or outputs ``[B, O]``
            (``[B, 2*O]`` natural parameters for heteroscedastic regression).
        likelihood: ``classification``, ``regression`` or ``heteroscedastic_regression``.
        n_data: training-set size ``N``.
        optimisation: how the loss is stepped (``MAPOptimisation``: optimiser, schedule, loss
            scale, what a non-finite loss does).
        prior_precision: initial precision (float: same for every tensor; or a tensor of
            shape ``[n_param_tensors]`` or ``[n_params]``).
        sigma_noise: initial Gaussian noise std (regression only).
        temperature: ``T`` above.
        prior_in_loss: ``False`` drops the prior term from the training loss.
    """

    def __init__(
        self,
        model: nn.Module,
        likelihood: str,
        n_data: int,
        optimisation: MAPOptimisation,
        prior_precision: float | torch.Tensor = 1.0,
        sigma_noise: float = 1.0,
        temperature: float = 1.0,
        prior_in_loss: bool = True,
    ):
        super().__init__()
        on_nonfinite_loss, loss_scale = optimisation.on_nonfinite_loss, optimisation.loss_scale
        self._trainer = None  # the loop that runs this module (Lightning's Trainer or the plain loop)
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood={likelihood!r} is not supported; allowed: {list(LIKELIHOODS)}")
        if n_data <= 0 or temperature <= 0 or sigma_noise <= 0:
            raise ValueError("n_data, temperature and sigma_noise must be positive")
        if on_nonfinite_loss not in ("error", "skip"):
            raise ValueError(f"on_nonfinite_loss={on_nonfinite_loss!r} is not supported; allowed: ['error', 'skip']")
        check_loss_scale(loss_scale, likelihood)
        self.on_nonfinite_loss = on_nonfinite_loss
        self.loss_scale = loss_scale
        self.n_skipped_batches = 0
        # What a resumed run must share with this one (seed, data, model); set by train.py and
        # saved in every checkpoint under RUN_IDENTITY_KEY.
        self.run_identity: dict | None = None
        self.run_fingerprint: dict | None = None  # saved under RUN_FINGERPRINT_KEY (training.resume)
        # Training time of earlier launches (read from the checkpoint this run resumed) and the
        # perf_counter at which this launch's training started (set by train.py).
        self.fit_seconds_before = 0.0
        self.fit_clock_start: float | None = None
        self.model = model
        self.likelihood = likelihood
        self.n_data = n_data
        self.temperature = temperature
        self.prior_in_loss = prior_in_loss
        self.optimizer_factory = optimisation.optimizer
        self.scheduler_factory = optimisation.lr_scheduler
        self.n_param_tensors = len(list(model.parameters()))
        self._prior: Prior | None = None
        self.register_buffer("prior_precision", torch.empty(0, dtype=self.hyper_dtype))
        self.set_prior_precision(prior_precision)
        self.register_buffer("log_sigma_noise", torch.empty((), dtype=self.hyper_dtype))
        self.set_sigma_noise(float(sigma_noise))
        # Set by the online-marglik callback in fused mode: records curvature during training steps.
        self.fused_curvature = None

    # --- what the plain loop provides (Lightning's versions win in MAPModule) --------------
    @property
    def trainer(self):
        return self._trainer

    @trainer.setter
    def trainer(self, trainer) -> None:
        self._trainer = trainer

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    def log_dict(self, values: dict, **kwargs) -> None:
        """Hand ``values`` to the plain loop, which logs them as Lightning's ``log_dict`` would
        with the same keyword arguments (``on_step=False, on_epoch=True, batch_size``)."""
        if self._trainer is not None:
            self._trainer.log_dict(values, **kwargs)

    # --- hyperparameters ------------------------------------------------------------------
    @property
    def sigma_noise(self) -> torch.Tensor:
        return self.log_sigma_noise.exp()

    @property
    def hyper_dtype(self) -> torch.dtype:
        """The dtype of the hyperparameter buffers: the model's first floating parameter's (the
        default dtype for a model without one)."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.get_default_dtype())

    def set_prior_precision(self, value: float | torch.Tensor) -> None:
        """Set delta: a float, or a tensor of shape ``[1]``, ``[n_param_tensors]`` or ``[n_params]``
        (stored in ``hyper_dtype``)."""
        value = torch.as_tensor(value, dtype=self.hyper_dtype).detach().flatten()  # a float: no float32 detour
        n_params = sum(p.numel() for p in self.model.parameters())
        if value.numel() == 1:
            value = value.expand(self.n_param_tensors).clone()
        if value.numel() not in (self.n_param_tensors, n_params):
            raise ValueError(
                f"prior_precision has {value.numel()} entries; allowed: 1, {self.n_param_tensors} "
                f"(one per parameter tensor) or {n_params} (one per parameter)"
            )
        self.prior_precision = value.to(self.prior_precision.device if self.prior_precision.numel() else value.device)

    def set_sigma_noise(self, value: float | torch.Tensor) -> None:
        """Set sigma (a positive scalar); ``log_sigma_noise`` holds its log in ``hyper_dtype``."""
        value = torch.as_tensor(value, dtype=self.hyper_dtype, device=self.log_sigma_noise.device).detach()
        self.log_sigma_noise = value.log().reshape(())

    # --- objective ------------------------------------------------------------------------
    @property
    def prior(self) -> Prior:
        """The engine's prior object for the buffer's shape: layerwise over every parameter tensor of
        the model, or diagonal (one precision per parameter)."""
        per_tensor = self.prior_precision.numel() == self.n_param_tensors
        if self._prior is None or self._prior.structure != ("layerwise" if per_tensor else "diagonal"):
            self._prior = Prior("layerwise" if per_tensor else "diagonal", [p.numel() for p in self.model.parameters()])
        return self._prior

    def prior_term(self) -> torch.Tensor:
        """``0.5 * sum_g delta_g ||theta_g||^2`` (or ``0.5 * sum_i delta_i theta_i^2``): ``Prior.penalty``."""
        return self.prior.penalty(self.prior_precision, list(self.model.parameters()))

    def nll(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Summed negative log likelihood of a batch."""
        return summed_nll(f, y, self.likelihood, self.sigma_noise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def scale(self) -> torch.Tensor | float:
        """The factor ``loss_scale`` puts on the per-datum negative log joint: 1, or ``2 sigma^2 T``
        (detached) for ``mse``."""
        if self.loss_scale == "nll":
            return 1.0
        return 2 * self.sigma_noise.detach() ** 2 * self.temperature

    def training_step(self, batch, batch_idx):
        x, y = batch
        scale = self.scale()
        if self.fused_curvature is not None:
            # d(loss) / d(the engine's summed NLL, unit noise for regression): the EF needs its gradients
            nll_scale = float(scale) / (len(x) * self.temperature)
            if self.likelihood == "regression":
                nll_scale /= float(self.sigma_noise) ** 2
            with self.fused_curvature.batch(y, nll_scale=nll_scale) as record:
                f = self.model(x)
                record.output(f)
        else:
            f = self.model(x)
        nll = self.nll(f, y) / len(x)
        loss = nll / self.temperature
        if self.prior_in_loss:
            loss = loss + self.prior_term() / self.n_data
        if not torch.isfinite(loss):  # one host sync per step: a NaN must not train on silently
            if self.on_nonfinite_loss == "error":
                raise FloatingPointError(
                    f"non-finite training loss {loss.item()} (train/nll={nll.item()}) at epoch {self.current_epoch}, "
                    f"batch {batch_idx}: the run stops (on_nonfinite_loss=error). Lower optimizer.lr, check the data, "
                    "or set on_nonfinite_loss=skip to skip such batches")
            self.n_skipped_batches += 1
            return None  # Lightning skips backward and the optimiser step
        if self._logs_train_epoch():
            self.log_dict({"train/loss": loss, "train/nll": nll}, on_step=False, on_epoch=True, batch_size=len(x))
        return loss * scale  # train/loss stays the per-datum negative log joint whatever the scale

    def _logs_train_epoch(self) -> bool:
        """Epoch means of the training loss are logged every epoch, except when an epoch has fewer
        batches than ``trainer.log_every_n_steps``: then every ``ceil(log_every_n_steps / batches)``-th
        epoch and the last (a full-batch run logs every ``log_every_n_steps`` epochs; each
        ``self.log`` costs about as much as the step of a small full-batch network)."""
        trainer = self._trainer
        if trainer is None:
            return True
        batches = trainer.num_training_batches
        if not batches or batches == float("inf") or batches >= trainer.log_every_n_steps:
            return True
        epoch = trainer.current_epoch + 1
        return epoch % math.ceil(trainer.log_every_n_steps / batches) == 0 or epoch == trainer.max_epochs

    def _eval_step(self, batch, stage: str):
        x, y = batch
        f = self.model(x)
        metrics = {f"{stage}/nll": self.nll(f, y) / len(x)}
        if self.likelihood == "classification":
            metrics[f"{stage}/acc"] = (f.argmax(-1) == y).float().mean()
        else:
            mean = natural_to_mean_var(f)[0] if self.likelihood == "heteroscedastic_regression" else f
            metrics[f"{stage}/mse"] = ((mean - y.reshape(mean.shape)) ** 2).mean()
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(x), prog_bar=stage == "val")

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def fit_seconds(self) -> float:
        """Training seconds so far: earlier launches' (from the resumed checkpoint) plus this one's."""
        now = 0.0 if self.fit_clock_start is None else time.perf_counter() - self.fit_clock_start
        return self.fit_seconds_before + now

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.run_identity is not None:
            checkpoint[RUN_IDENTITY_KEY] = self.run_identity
        if self.run_fingerprint is not None:
            checkpoint[RUN_FINGERPRINT_KEY] = self.run_fingerprint
        checkpoint[FIT_SECONDS_KEY] = self.fit_seconds()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.fit_seconds_before = float(checkpoint.get(FIT_SECONDS_KEY, 0.0))

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.model.parameters())
        if self.scheduler_factory is None:
            return optimizer
        if scheduler_interval(self.scheduler_factory) == "step":  # training.schedules
            scheduler = self.scheduler_factory(optimizer, self.trainer.estimated_stepping_batches)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        return {"optimizer": optimizer, "lr_scheduler": self.scheduler_factory(optimizer)}


# ``MAPModule`` (the Lightning class) on first use: importing Lightning costs seconds
__getattr__ = lazy_attributes(__name__, {"MAPModule": "laplace_lab.training.lightning_classes"})
