"""Run a dict of predictors over batches and collect their outputs on the CPU.

Autograd is deliberately left on while predicting: a Laplace GLM predictive may need it
internally for Jacobians. Outputs are detached right away, so no graph is kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from tqdm import tqdm

Predictor = Callable[[Tensor], "Tensor | tuple[Tensor, Tensor]"]


@contextmanager
def eval_mode(*objs):
    """Put every ``nn.Module`` among ``objs`` in eval mode; restore the previous modes after."""
    modules = [o for o in objs if isinstance(o, nn.Module)]
    before = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for m, was in zip(modules, before):
            m.train(was)


def limit(batches: Iterable, max_batches: int | None) -> Iterator:
    return iter(batches) if max_batches is None else itertools.islice(batches, max_batches)


def n_batches(loader, max_batches: int | None) -> int | None:
    try:
        n = len(loader)
    except TypeError:
        return max_batches
    return n if max_batches is None else min(n, max_batches)


def check_probs(p: Tensor, name: str, batch: int) -> Tensor:
    """Probabilities ``[B, C]`` with rows summing to one, else a clear error."""
    if not isinstance(p, Tensor) or p.ndim != 2 or p.shape[0] != batch:
        shape = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
        raise ValueError(f"predictor {name!r} must return probabilities of shape [B={batch}, C]; got {shape}")
    p = p.detach().float().cpu()
    if not torch.isfinite(p).all():
        raise ValueError(f"predictor {name!r} returned non-finite probabilities")
    if (p < -1e-5).any() or (p > 1 + 1e-5).any() or ((p.sum(1) - 1).abs() > 1e-3).any():
        raise ValueError(
            f"predictor {name!r} must return probabilities (rows in [0, 1] summing to 1), "
            "not logits; wrap the network in a softmax"
        )
    return p


def check_regression(out, name: str, batch: int) -> tuple[Tensor, Tensor]:
    """``(mean [B, O], var [B, O])`` from a regression predictor, else a clear error."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ValueError(f"regression predictor {name!r} must return (mean, var); got {type(out).__name__}")
    mean, var = (t.detach().float().cpu() for t in out)
    mean = mean.reshape(batch, -1)
    var = var.reshape(batch, -1)
    if mean.shape != var.shape:
        raise ValueError(f"predictor {name!r}: mean {tuple(mean.shape)} and var {tuple(var.shape)} differ")
    return mean, var


def run_predictors(predictors: dict[str, Predictor], batches: Iterable, task: str = "classification",
                   device: torch.device | str = "cpu", keep_inputs: int = 0, desc: str = "",
                   progress: bool = True, total: int | None = None):
    """Apply every predictor to every ``(x, y)`` batch.

    Returns ``(outputs, y, kept_x)``: ``outputs[name]`` is ``probs [N, C]`` (classification) or
    ``(mean [N, O], var [N, O])`` (regression); ``y`` the concatenated targets; ``kept_x`` the
    first ``keep_inputs`` inputs (CPU) or ``None``.
    """
    outs: dict[str, list] = {k: [] for k in predictors}
    ys, kept, n_kept = [], [], 0
    for x, y in tqdm(batches, desc=desc, total=total, disable=not progress, leave=False):
        if n_kept < keep_inputs:
            kept.append(x[: keep_inputs - n_kept].detach().cpu())
            n_kept += len(kept[-1])
        xd = x.to(device)
        for name, f in predictors.items():
            out = f(xd)
            if task == "classification":
                outs[name].append(check_probs(out, name, len(x)))
            else:
                outs[name].append(check_regression(out, name, len(x)))
        ys.append(y.detach().cpu())
    if not ys:
        raise ValueError(f"no batches to evaluate ({desc or 'loader'} is empty)")
    if task == "classification":
        result = {k: torch.cat(v) for k, v in outs.items()}
    else:
        result = {k: (torch.cat([m for m, _ in v]), torch.cat([s for _, s in v])) for k, v in outs.items()}
    return result, torch.cat(ys), (torch.cat(kept) if kept else None)


def tensor_batches(x: Tensor, chunk_size: int, y: Tensor | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Chunks ``(x[i:i+c], y[i:i+c])`` of an in-memory tensor (dummy zero labels if no ``y``)."""
    y = torch.zeros(len(x), dtype=torch.long) if y is None else y
    for i in range(0, len(x), chunk_size):
        yield x[i : i + chunk_size], y[i : i + chunk_size]


def predict_probs(predictors: dict[str, Predictor], x: Tensor, chunk_size: int = 256,
                  device="cpu", desc: str = "", progress: bool = False) -> dict[str, Tensor]:
    """Probabilities of every predictor on an in-memory input tensor, in chunks."""
    total = -(-len(x) // chunk_size)
    out, _, _ = run_predictors(predictors, tensor_batches(x, chunk_size), "classification", device,
                               desc=desc, progress=progress, total=total)
    return out
