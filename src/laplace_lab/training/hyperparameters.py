"""Map between the Laplace engine's prior precisions and the training module's buffers.

The training module (``MAPModule``) always holds one prior precision per parameter tensor of
the *whole* model (``[n_param_tensors]``), or one per parameter (``[n_params]``) for a diagonal
prior. A Laplace approximation covers a subset (all weights, or the last layer) and a prior
structure (scalar ``[1]``, layerwise ``[n_subset_tensors]``, diagonal ``[n_subset_params]``).
"""

from __future__ import annotations

import torch
from torch import nn

PRIOR_STRUCTURES = ("scalar", "layerwise", "diagonal")


def subset_tensor_indices(model: nn.Module, subset_params: list[torch.Tensor]) -> list[int]:
    """Positions of ``subset_params`` in ``list(model.parameters())``."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    return [position[id(p)] for p in subset_params]


def initial_log_prior(module_prior: torch.Tensor, model: nn.Module, subset_params: list[torch.Tensor],
                      structure: str) -> torch.Tensor:
    """Log prior precision in the engine's shape, read off the module's buffer.

    ``scalar`` takes the mean over the subset's tensors; ``diagonal`` expands per-tensor values.
    """
    params = list(model.parameters())
    idx = subset_tensor_indices(model, subset_params)
    if module_prior.numel() == len(params):  # one per tensor
        per_tensor = module_prior[idx]
        if structure == "scalar":
            return per_tensor.mean().log().reshape(1)
        if structure == "layerwise":
            return per_tensor.log()
        return torch.cat([v.expand(params[i].numel()) for v, i in zip(per_tensor, idx)]).log()
    if structure != "diagonal":
        raise ValueError(f"prior.structure={structure!r} cannot start from a per-parameter prior; allowed: ['diagonal']")
    offsets = torch.tensor([0] + [p.numel() for p in params]).cumsum(0)
    return torch.cat([module_prior[offsets[i]:offsets[i + 1]] for i in idx]).log()


def write_prior(module_prior: torch.Tensor, model: nn.Module, subset_params: list[torch.Tensor],
                structure: str, prior: torch.Tensor) -> torch.Tensor:
    """Return the module's prior buffer with the subset's entries replaced by ``prior``
    (engine shape); tensors outside the subset keep their precision."""
    params = list(model.parameters())
    idx = subset_tensor_indices(model, subset_params)
    prior = prior.detach().to(module_prior)
    if structure != "diagonal":
        new = module_prior.clone()
        new[idx] = prior.expand(len(idx)) if structure == "scalar" else prior
        return new
    if module_prior.numel() == len(params):  # switch the module to a per-parameter prior
        module_prior = torch.cat([v.expand(p.numel()) for v, p in zip(module_prior, params)])
    new = module_prior.clone()
    offsets = torch.tensor([0] + [p.numel() for p in params]).cumsum(0)
    start = 0
    for i in idx:
        n = params[i].numel()
        new[offsets[i]:offsets[i + 1]] = prior[start:start + n]
        start += n
    return new
