"""One optimiser for the Laplace hyperparameters: Adam on the log prior precisions (and, for
regression, the log noise std) maximising the log marginal likelihood of a fitted ``Laplace``.

Used by online marglik (``training.online_marglik``: a few steps after every fit, learning-rate
schedule and checkpointed state there) and by post-hoc tuning (``Laplace.optimize_prior_precision(
method="marglik")``).

Each step takes the gradient from the fastest source the fit's structure provides, chosen
automatically (``eigen_marglik.closed_form``): the closed-form gradient in an eigenbasis
(``curvature_eigenvalues``: kron, diag; ``O(P)``, no autograd) or from one dense Cholesky
(``dense_cholesky``: full); otherwise autograd through ``Laplace.log_marginal_likelihood``. Both give
the same values to rounding. A step whose marglik or gradient is not finite, or whose evaluation
raises ``torch.linalg.LinAlgError`` (an indefinite precision), or whose update is not finite, is
rejected: values and Adam state stay as before it. Log values are clamped to ``[log_min, log_max]``
after every step (``None``: no bound).

The optimiser is a plain ``torch.optim.Adam`` (its hyperparameters, state layout and ``state_dict``);
its update is applied by ``adam_update`` below, the same formula and operations as ``Adam.step``
(bit-equal on CPU, ``tests/laplace/test_hyper.py``), because ``Adam.step`` checks for an accelerator on
every call, which under Lightning (NVML-based CUDA check) measured 0.82 ms per call against 0.17 ms
for the update itself (busy 2-core machine): four times a whole closed-form hyper step.

With a closed form, ``run`` and online marglik take all of a phase's steps in ``run_closed_form``:
``O(P)`` element-wise work per step (kron, diag) and no host synchronisation in the loop (the
acceptance of a step is a device-side mask; the count of accepted steps is read once at the end), so
on a GPU a step costs its few dozen kernel launches, not a round trip per check.

Shapes: ``log_prior`` the shape of ``Laplace.prior_precision`` (``[1]``, ``[n_layers]``,
``[n_groups]`` or ``[P]``); ``log_sigma`` 0-dim.
"""

from __future__ import annotations

import warnings

import torch

from laplace_lab.laplace import checks, eigen_marglik


def adam_update(opt: torch.optim.Adam) -> None:
    """One ``torch.optim.Adam`` step of its parameters that have a ``grad`` (plain Adam: no amsgrad,
    weight decay, maximize or capturable settings; ``ValueError`` otherwise). Same state
    (``step``, ``exp_avg``, ``exp_avg_sq``) and operations as ``Adam.step``'s single-tensor path."""
    for g in opt.param_groups:
        if g["amsgrad"] or g["weight_decay"] or g["maximize"] or g.get("capturable") or g.get("differentiable"):
            raise ValueError("adam_update: only plain Adam (no amsgrad, weight_decay, maximize, capturable)")
        beta1, beta2 = g["betas"]
        with torch.no_grad():
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = opt.state[p]
                if len(st) == 0:
                    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                    st["step"] = torch.tensor(0.0, dtype=scalar)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["step"] += 1
                st["exp_avg"].lerp_(p.grad, 1 - beta1)
                st["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step = st["step"].item()
                denom = (st["exp_avg_sq"].sqrt() / (1 - beta2**step) ** 0.5).add_(g["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-(g["lr"] / (1 - beta1**step)))


def all_finite(tensors) -> bool:
    """One check (one host sync on an accelerator) for a few small tensors."""
    return bool(torch.isfinite(torch.cat([t.detach().reshape(-1) for t in tensors])).all())


class MarglikOptimizer:
    """``torch.optim.Adam`` on ``log_prior`` (and ``log_sigma``) with rejection and clamping.

    Args:
        log_prior: start values (copied; the optimiser owns ``self.log_prior``).
        log_sigma: start log noise std (regression; ``None``: the noise is not tuned).
        lr: Adam rate (``set_lr`` changes it between steps).
        log_min, log_max: clamp range of every log value (``None``: unbounded).
    """

    def __init__(self, log_prior: torch.Tensor, log_sigma: torch.Tensor | None = None, lr: float = 0.1,
                 log_min: float | None = None, log_max: float | None = None):
        self.log_prior = log_prior.detach().clone().requires_grad_(True)
        self.log_sigma = None if log_sigma is None else log_sigma.detach().clone().requires_grad_(True)
        self.log_min, self.log_max = log_min, log_max
        self.optimizer = torch.optim.Adam(self.params, lr=lr)

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for p in (self.log_prior, self.log_sigma) if p is not None]

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---- objective ------------------------------------------------------------------------------
    @staticmethod
    def closed_form(la):
        """The structure's fast marglik (``eigen_marglik.closed_form``) or ``None`` (also, with a
        warning, if it does not reproduce ``la.log_marginal_likelihood``: a convention it lacks)."""
        try:
            return eigen_marglik.closed_form(la)
        except ValueError as err:
            warnings.warn(f"marglik optimiser: using Laplace.log_marginal_likelihood ({err})", stacklevel=3)
            return None

    def marglik(self, la) -> torch.Tensor:
        """``la.log_marginal_likelihood`` at the current values (sets them on ``la``, graph kept)."""
        dtype = la.mean.dtype
        sigma = self.log_sigma.to(dtype).exp() if self.log_sigma is not None else None
        return la.log_marginal_likelihood(prior_precision=self.log_prior.to(dtype).exp(), sigma_noise=sigma)

    def _gradients(self, la, fast) -> list[torch.Tensor] | None:
        """Sets ``p.grad`` to the gradient of ``-log marglik``; returns the tensors to check for
        finiteness, or ``None`` when the evaluation failed."""
        for p in self.params:
            p.grad = None
        try:
            if fast is not None:
                g_prior, g_sigma = fast.grad_log(self.log_prior, self.log_sigma)
                self.log_prior.grad = -g_prior
                if self.log_sigma is not None:
                    self.log_sigma.grad = -g_sigma
                return [p.grad for p in self.params]
            neg = -self.marglik(la)
            neg.backward()
        except (torch.linalg.LinAlgError, checks.HyperparameterError):  # indefinite precision; exp overflow
            return None
        if any(p.grad is None for p in self.params):
            return None
        return [neg, *(p.grad for p in self.params)]

    # ---- steps ----------------------------------------------------------------------------------
    def step(self, la, fast=None) -> bool:
        """One Adam step on ``-log marglik`` of ``la`` (``fast``: a ``closed_form(la)`` object or
        ``None`` for autograd); returns whether it was accepted."""
        checks = self._gradients(la, fast)
        if checks is None or not all_finite(checks):
            return False
        saved = [p.detach().clone() for p in self.params]
        saved_state = self._snapshot_state()
        adam_update(self.optimizer)
        with torch.no_grad():
            if self.log_min is not None or self.log_max is not None:
                for p in self.params:
                    p.clamp_(self.log_min, self.log_max)
            if not all_finite(self.params):
                for p, s in zip(self.params, saved):
                    p.copy_(s)
                self._restore_state(saved_state)
                return False
        return True

    def run(self, la, steps) -> tuple[int, int]:
        """One step per item of ``steps`` (an int: ``range(steps)``; or e.g. a tqdm range) with the
        automatically chosen gradient source; returns ``(accepted, rejected)``. With a closed form
        and an int ``steps`` the steps run on the device without host synchronisation
        (``run_closed_form``)."""
        fast = self.closed_form(la)
        if fast is not None and isinstance(steps, int):
            accepted = int(self.run_closed_form(fast, steps))
            return accepted, steps - accepted
        results = [self.step(la, fast) for _ in (range(steps) if isinstance(steps, int) else steps)]
        return sum(results), len(results) - sum(results)

    @torch.no_grad()
    def run_closed_form(self, fast, n_steps: int, lr=None) -> torch.Tensor:
        """``n_steps`` steps on ``fast.grad_log`` (a ``closed_form`` object) with no host
        synchronisation: the acceptance of each step (finite gradient, finite values after the
        update and clamping) is a device-side mask, and a rejected step leaves values and Adam state
        as ``step`` would. ``lr``: ``None`` (the optimiser's rate), a float, or a callable of the
        float64 0-dim device tensor counting the steps accepted so far in this call, returning the
        rate (a float or a 0-dim tensor). Returns that count after the last step (int64 0-dim, on
        the device: reading it is the one synchronisation). Same formulas as ``adam_update``
        (equal to rounding). A ``grad_log`` that raises ``torch.linalg.LinAlgError`` (``FullMarglik``'s
        Cholesky, which synchronises anyway) rejects that step."""
        group = self.optimizer.param_groups[0]
        if group["amsgrad"] or group["weight_decay"] or group["maximize"]:
            raise ValueError("run_closed_form: only plain Adam (no amsgrad, weight_decay, maximize)")
        beta1, beta2 = group["betas"]
        eps = group["eps"]
        params = self.params
        device = params[0].device
        states = []
        for p in params:
            st = self.optimizer.state[p]
            if len(st) == 0:
                scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                st["step"] = torch.tensor(0.0, dtype=scalar)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            states.append(st)
        steps = [st["step"].to(device=device, dtype=torch.float64) for st in states]
        accepted = torch.zeros((), dtype=torch.float64, device=device)
        for _ in range(n_steps):
            rate = group["lr"] if lr is None else (lr(accepted) if callable(lr) else lr)
            try:
                g_prior, g_sigma = fast.grad_log(self.log_prior, self.log_sigma)
            except torch.linalg.LinAlgError:  # FullMarglik's Cholesky of an indefinite precision: rejected
                continue
            grads = [-g_prior] + ([-g_sigma] if self.log_sigma is not None else [])
            new = []
            for p, g, st, step in zip(params, grads, states, steps):
                step = step + 1
                m = st["exp_avg"].lerp(g, 1 - beta1)
                v = st["exp_avg_sq"].mul(beta2).addcmul_(g, g, value=1 - beta2)
                step_size = rate / (1 - torch.pow(beta1, step))
                denom = (v.sqrt() / (1 - torch.pow(beta2, step)).sqrt()).add_(eps)
                value = p + (m * (-step_size).to(p.dtype)) / denom  # addcdiv's (value * t1) / t2
                if self.log_min is not None or self.log_max is not None:
                    value = value.clamp(self.log_min, self.log_max)
                new.append((value, m, v, step))
            ok = torch.isfinite(torch.cat([t.reshape(-1) for t in (*grads, *(n[0] for n in new))])).all()
            for i, (p, st, (value, m, v, step)) in enumerate(zip(params, states, new)):
                p.copy_(torch.where(ok, value, p))
                st["exp_avg"] = torch.where(ok, m, st["exp_avg"])
                st["exp_avg_sq"] = torch.where(ok, v, st["exp_avg_sq"])
                steps[i] = torch.where(ok, step, steps[i])
            accepted = accepted + ok
        for st, step in zip(states, steps):
            st["step"] = step.to(device=st["step"].device, dtype=st["step"].dtype)
        return accepted.long()

    def _snapshot_state(self) -> list[dict | None]:
        """Copies of Adam's per-parameter state (tiny tensors cloned)."""
        st = self.optimizer.state
        return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in st[p].items()} if p in st else None
                for p in self.params]

    def _restore_state(self, saved: list[dict | None]) -> None:
        for p, s in zip(self.params, saved):
            if s is None:
                self.optimizer.state.pop(p, None)
            else:
                self.optimizer.state[p] = s

    # ---- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"log_prior": self.log_prior.detach().clone(),
                "log_sigma": None if self.log_sigma is None else self.log_sigma.detach().clone(),
                "adam": self.optimizer.state_dict()}

    @classmethod
    def from_state_dict(cls, state: dict, lr: float, log_min=None, log_max=None) -> MarglikOptimizer:
        opt = cls(state["log_prior"], state["log_sigma"], lr=lr, log_min=log_min, log_max=log_max)
        opt.optimizer.load_state_dict(state["adam"])
        return opt
