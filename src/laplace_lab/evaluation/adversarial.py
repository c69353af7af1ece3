"""Gradient attacks: FGSM (Goodfellow et al. 2015) and the confidence-maximising attack from
uniform noise (Kristiadi, Hein & Hennig 2020; Hein et al. 2019).

The attacked model is a callable on inputs ``x``:
- ``output="logits"``: an ``nn.Module`` returning logits ``[B, C]``; loss = cross-entropy;
- ``output="probs"``: any predictor returning probabilities ``[B, C]`` (e.g. the Laplace GLM
  probit predictive, or an MC predictive with reparameterised samples); loss = NLL of the probs;
- ``output="auto"``: ``"logits"`` for an ``nn.Module``, ``"probs"`` for any other callable.

FGSM: ``x_adv = clamp(x + eps * sign(grad_x loss(x, y)), input_range)`` with the true labels.
The gradient sign does not depend on eps, so a sweep computes it once per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

ATTACK_OUTPUTS = ("auto", "logits", "probs")


def resolve_output(model: Callable, output: str = "auto") -> str:
    if output not in ATTACK_OUTPUTS:
        raise ValueError(f"attack output={output!r} is not supported; allowed: {list(ATTACK_OUTPUTS)}")
    if output == "auto":
        return "logits" if isinstance(model, nn.Module) else "probs"
    return output


def log_probs_fn(model: Callable, output: str = "auto") -> Callable[[Tensor], Tensor]:
    """``x -> log p(.|x)`` ``[B, C]`` of the attacked model, differentiable w.r.t. ``x``."""
    kind = resolve_output(model, output)
    if kind == "logits":
        return lambda x: torch.log_softmax(model(x), dim=-1)
    return lambda x: model(x).clamp_min(1e-30).log()


class NotDifferentiableError(RuntimeError):
    """The attacked model's output does not depend differentiably on its input."""


def _input_grad(objective: Tensor, x: Tensor) -> Tensor:
    if not objective.requires_grad:
        raise NotDifferentiableError(
            "the attacked model's output has no gradient w.r.t. its input (computed under no_grad "
            "or detached?)"
        )
    (grad,) = torch.autograd.grad(objective, x)
    return grad


def _clamp(x: Tensor, input_range) -> Tensor:
    return x if input_range is None else x.clamp(*input_range)


def fgsm_direction(log_probs: Callable[[Tensor], Tensor], x: Tensor, y: Tensor) -> Tensor:
    """``sign(grad_x sum_i NLL_i)``: the FGSM step direction, same shape as ``x``."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = nn.functional.nll_loss(log_probs(x), y, reduction="sum")
        grad = _input_grad(loss, x)
    return grad.sign()


def fgsm(model: Callable, x: Tensor, y: Tensor, eps: float, input_range=(0.0, 1.0),
         output: str = "auto") -> Tensor:
    """One FGSM step of size ``eps`` against ``model`` with the true labels ``y``."""
    direction = fgsm_direction(log_probs_fn(model, output), x, y)
    return _clamp(x.detach() + eps * direction, input_range)


def confidence_max_attack(model: Callable, x0: Tensor, eps: float, steps: int = 10,
                          step_size: float | None = None, input_range=(0.0, 1.0),
                          output: str = "auto") -> Tensor:
    """Signed-gradient ascent on ``log max_c p(c|x)`` from ``x0`` within ``||x - x0||_inf <= eps``.

    ``step_size`` defaults to ``2.5 * eps / steps`` (Madry et al. 2018). Returns ``x`` (detached).
    """
    if eps == 0:
        return x0.detach()
    log_probs = log_probs_fn(model, output)
    alpha = step_size if step_size is not None else 2.5 * eps / steps
    x0 = x0.detach()
    x = x0.clone()
    for _ in range(steps):
        x.requires_grad_(True)
        with torch.enable_grad():
            objective = log_probs(x).max(dim=-1).values.sum()
            grad = _input_grad(objective, x)
        x = x.detach() + alpha * grad.sign()
        x = _clamp(torch.max(torch.min(x, x0 + eps), x0 - eps), input_range)
    return x.detach()


@dataclass(frozen=True)
class ProgressBar:
    """The progress bar over a sweep's batches (tqdm, left behind when done).

    Args:
        desc: its label, also named in the error for an empty ``batches``.
        show: ``False`` draws no bar.
        total: the number of batches (``None``: unknown).
    """

    desc: str = "fgsm"
    show: bool = True
    total: int | None = None


def fgsm_sweep(attacked: Callable, output: str, predictors: dict[str, Callable], batches,
               epsilons, input_range=(0.0, 1.0), device="cpu", bar: ProgressBar | None = None):
    """FGSM against ``attacked`` at every ``eps``; every predictor is evaluated on the same inputs.

    ``bar``: the progress bar (default ``ProgressBar()``). Returns ``(probs, y)`` with
    ``probs[eps][name]``: ``[N, C]`` on the CPU.
    """
    from tqdm import tqdm

    from laplace_lab.evaluation.predict import check_probs

    bar = ProgressBar() if bar is None else bar
    desc = bar.desc
    log_probs = log_probs_fn(attacked, output)
    out = {e: {k: [] for k in predictors} for e in epsilons}
    ys = []
    for x, y in tqdm(batches, desc=desc, total=bar.total, disable=not bar.show, leave=False):
        x, yd = x.to(device), y.to(device)
        direction = fgsm_direction(log_probs, x, yd)
        for e in epsilons:
            x_adv = _clamp(x.detach() + e * direction, input_range)
            for name, f in predictors.items():
                out[e][name].append(check_probs(f(x_adv), name, len(x)))
        ys.append(y.detach().cpu())
    if not ys:
        raise ValueError(f"no batches to attack ({desc})")
    return {e: {k: torch.cat(v) for k, v in d.items()} for e, d in out.items()}, torch.cat(ys)
