"""Input checks at the engine's entry points (``Laplace.__init__``, ``fit``, the prior / noise setters,
``log_marginal_likelihood``, the predictive, ``compat``): each refuses nonsense with a ``ValueError``
that names the argument and what it got, before the nonsense turns into a plausible number.

Cost: nothing here makes an extra pass over the data. Per batch, ``BatchChecks`` looks at tensors the
fit computes anyway (inputs ``X``, outputs ``f`` ``[N, C]``, prepared targets) with one small reduction
each, counted on the device (no host synchronisation per batch); the counts are read once, in
``BatchChecks.raise_if_any`` at ``fit_end``. Hyperparameter checks read a few numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn


class HyperparameterError(ValueError):
    """A prior precision, noise or temperature that is not positive and finite. The marglik optimiser
    (``hyper``) treats it as a rejected step, as an indefinite precision, when its own update overflows."""


def _shown(t: torch.Tensor) -> str:
    """A short description of ``t`` for messages: the value, or the offending entries of a vector."""
    t = t.detach().reshape(-1)
    if t.numel() == 1:
        return f"{float(t):g}"
    bad = ~(torch.isfinite(t) & (t > 0))
    idx = bad.nonzero().reshape(-1)[:3].tolist()
    return f"a tensor of {t.numel()} entries with {int(bad.sum())} bad, e.g. " + ", ".join(
        f"[{i}]={float(t[i]):g}" for i in idx)


def positive_finite(option: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` unchanged if every entry is finite and > 0, else a ``HyperparameterError`` naming ``option``
    (one host read of a 0-dim flag; ``t`` may carry a graph)."""
    d = t.detach()
    if d.numel() == 0 or not bool((torch.isfinite(d) & (d > 0)).all()):
        what = "an empty tensor" if d.numel() == 0 else _shown(d)
        raise HyperparameterError(f"{option} must be finite and > 0; got {what}")
    return t


def finite(option: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` unchanged if every entry is finite, else a ``ValueError`` naming ``option``."""
    d = t.detach()
    if not bool(torch.isfinite(d).all()):
        raise ValueError(f"{option} must be finite; got {int((~torch.isfinite(d)).sum())} NaN/inf entries of "
                         f"{d.numel()}")
    return t


def temperature(value) -> float:
    """``value`` as a float if it is a finite number > 0, else a ``HyperparameterError``."""
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise HyperparameterError(f"temperature must be a finite number > 0; got {value!r}") from None
    if not (math.isfinite(t) and t > 0):
        raise HyperparameterError(f"temperature must be a finite number > 0; got {value!r}")
    return t


def first_parameter(model: nn.Module) -> torch.Tensor:
    """The first parameter of ``model`` (its device and dtype are the engine's), or a ``ValueError``."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    p = next(model.parameters(), None)
    if p is None:
        raise ValueError(f"model {type(model).__name__} has no parameters: a Laplace approximation needs "
                         "weights to put a posterior on")
    return p


def first_batch(loader: Iterable, option: str = "train_loader"):
    """The first batch of ``loader``, or a ``ValueError`` for an empty one."""
    batch = next(iter(loader), None)
    if batch is None:
        raise ValueError(_empty(option))
    return batch


def _empty(option: str) -> str:
    return (f"{option} yielded no data: fit needs at least one datum (a Laplace approximation of no data "
            "is the prior, and its evidence a plausible-looking number)")


def model_output(out, where: str = "fit") -> None:
    """``ValueError`` unless the model's forward returned one tensor with a batch dimension."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"the model must return a tensor [N, C] (one output per datum); its forward returned "
                         f"{type(out).__name__} in {where} (wrap the model to return the logits / predictions)")
    if out.ndim == 0:
        raise ValueError(f"the model must return a tensor [N, C]; its forward returned a 0-dim tensor in {where}")


def finite_inputs(option: str, x) -> None:
    """``ValueError`` if the tensor ``x`` ``[B, ...]`` has no rows or, floating point, holds NaN or inf
    (one reduction, one host read)."""
    if isinstance(x, torch.Tensor) and (x.ndim == 0 or x.shape[0] == 0):
        raise ValueError(f"{option} must be a batch [B, ...] of at least one input; got shape {tuple(x.shape)}")
    if isinstance(x, torch.Tensor) and x.is_floating_point() and not bool(torch.isfinite(x).all()):
        n = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{option} holds {n} non-finite entries (NaN/inf) of shape {tuple(x.shape)}")


def _all_finite(t: torch.Tensor) -> torch.Tensor:
    """0-dim bool on ``t``'s device: all entries finite (min and max propagate NaN and inf; no [t] temporary)."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    lo, hi = torch.aminmax(t.detach().reshape(-1))
    return torch.isfinite(lo) & torch.isfinite(hi)


class BatchChecks:
    """Device-side counts of bad batches during a fit; ``raise_if_any`` reads them once at the end.

    Counted: non-finite inputs ``X`` (floating point), non-finite outputs ``f``, non-finite targets
    (regression likelihoods) and float classification targets that are not whole non-negative numbers."""

    def __init__(self):
        self.counts: dict[str, torch.Tensor] = {}
        self.n_batches = 0

    def _add(self, kind: str, bad: torch.Tensor) -> None:
        c = self.counts.get(kind)
        self.counts[kind] = bad.to(torch.int64) if c is None else c + bad.to(c.device, torch.int64)

    def inputs(self, X) -> None:
        """One batch's model input (dict inputs: each floating-point tensor value)."""
        values = X.values() if isinstance(X, dict) else (X,)
        for v in values:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                self._add("inputs X", ~_all_finite(v))

    def class_targets(self, out: torch.Tensor, y) -> None:
        """Classification, before the targets are cast to ``long``: ``y`` must be class indices ``[N]``
        (``[N, 1]`` accepted) for outputs ``[N, ...]``; one-hot or probability targets ``[N, C]`` are a
        ``ValueError`` now, float indices that are not whole non-negative numbers are counted."""
        if not isinstance(y, torch.Tensor):
            raise ValueError(f"targets must be class indices [N] (a tensor); got {type(y).__name__}")
        n = out.shape[0]
        if tuple(y.shape) not in ((n,), (n, 1)) or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"targets must be class indices [N] for likelihood='classification'; got y of "
                             f"shape {tuple(y.shape)}, dtype {y.dtype} for output {tuple(out.shape)} (one-hot "
                             "or probability targets: use y.argmax(-1))")
        if y.is_floating_point():
            self._add("class indices y", ((y != y.round()) | (y < 0) | ~torch.isfinite(y)).any())

    def outputs(self, f: torch.Tensor, y: torch.Tensor) -> None:
        """One batch's outputs ``f`` ``[N, C]`` and prepared targets ``y`` (float targets: regression)."""
        self.n_batches += 1
        self._add("model outputs", ~_all_finite(f))
        if y.is_floating_point():
            self._add("targets y", ~_all_finite(y))

    def raise_if_any(self, n_data: int, loss: torch.Tensor) -> None:
        """``ValueError`` for any bad batch or a non-finite summed ``loss`` (0-dim) over ``n_data`` data
        (the one host read of the counts)."""
        names = list(self.counts)
        flags = torch.stack([*(self.counts[k].to(loss.device) for k in names),
                             (~torch.isfinite(loss.detach())).to(torch.int64)]).tolist()
        bad = [(k, c) for k, c in zip(names, flags) if c]
        if bad:
            hints = {"inputs X": "NaN/inf in the features: clean the data",
                     "model outputs": "NaN/inf outputs: the network overflows or its weights are not finite",
                     "targets y": "NaN/inf regression targets",
                     "class indices y": "float targets that are not class indices 0, 1, ..., C-1"}
            parts = "; ".join(f"{k} in {c} batch(es) ({hints[k]})" for k, c in bad)
            raise ValueError(f"fit: bad {parts}; of {self.n_batches} batches")
        if flags[-1]:
            raise ValueError(f"fit: the training loss is not finite ({float(loss):g}) over {n_data} data")


def _restoring_mode(la, check) -> None:
    """``check()``; on a ``ValueError`` the train/eval mode ``fit_begin`` changed is restored first."""
    try:
        check()
    except ValueError:
        if getattr(la, "_was_training", False):
            la.model.train()
        raise


def data_seen(la) -> None:
    """After ``fit``'s data pass: ``ValueError`` if ``train_loader`` yielded no datum (``la.n_data == 0``)."""
    def check():
        if la.n_data == 0:
            raise ValueError(_empty("train_loader"))
    _restoring_mode(la, check)


def fit_complete(la) -> None:
    """At ``fit_end``, before the structure's decompositions: the batch checks of ``la`` (a ``Laplace``),
    then the curvature."""
    def check():
        la.batch_checks.raise_if_any(la.n_data, la.loss)
        finite_curvature(la.structure)
    _restoring_mode(la, check)


def finite_curvature(structure) -> None:
    """``ValueError`` if a floating-point tensor the posterior structure holds (curvature accumulators,
    factors, decompositions) is not finite: one min/max per tensor, once per fit."""
    for name, t in _tensors(vars(structure)):
        if t.is_floating_point() and not bool(_all_finite(t)):
            raise ValueError(f"fit: the curvature ({type(structure).__name__}.{name}) is not finite (NaN/inf) "
                             "although inputs, outputs and targets were: the network's Jacobians overflow "
                             "(weights or activations too large); check the model's weights")


def _tensors(obj, prefix: str = "", depth: int = 0):
    """``(path, tensor)`` of every tensor in nested dicts / lists / tuples (no modules, depth <= 3)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, nn.Module) or depth > 3:
        return
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}[{i}]", depth + 1)
