"""Map between the Laplace engine's prior precisions and the training module's buffers.

The training module (``MAPModule``) always holds one prior precision per parameter tensor of
the *whole* model (``[n_param_tensors]``), or one per parameter (``[n_params]``) for a diagonal
prior. A Laplace approximation covers a subset (all weights, or the last layer) and a prior
structure (scalar ``[1]``, layerwise ``[n_subset_tensors]``, diagonal ``[n_subset_params]``,
normgroups ``[n_groups]`` with ``groups`` ``[n_subset_tensors]`` the group index of every subset
tensor, ``Laplace.prior_groups``).
"""

from __future__ import annotations

import torch
from torch import nn

from laplace_lab.laplace.options import PriorStructure
from laplace_lab.laplace.priors import Prior

PRIOR_STRUCTURES = PriorStructure.values()


def subset_tensor_indices(model: nn.Module, subset_params: list[torch.Tensor]) -> list[int]:
    """Positions of ``subset_params`` in ``list(model.parameters())``."""
    position = {id(p): i for i, p in enumerate(model.parameters())}
    return [position[id(p)] for p in subset_params]


def example_input(input_shape, model: nn.Module) -> torch.Tensor | None:
    """Zeros ``[2, *input_shape]`` on the model's device and dtype (the input the normgroups
    detection traces; ``None`` if ``input_shape`` is ``None``)."""
    if input_shape is None:
        return None
    p = next(model.parameters())
    return torch.zeros(2, *input_shape, device=p.device, dtype=p.dtype)


def _subset_prior(structure: str, subset_params: list[torch.Tensor], groups) -> Prior:
    if structure == "normgroups" and groups is None:
        raise ValueError("prior.structure='normgroups' needs the group index of every tensor (Laplace.prior_groups)")
    return Prior(structure, [p.numel() for p in subset_params], groups)


def initial_log_prior(module_prior: torch.Tensor, model: nn.Module, subset_params: list[torch.Tensor],
                      structure: str, groups: torch.Tensor | None = None) -> torch.Tensor:
    """Log prior precision in the engine's shape, read off the module's buffer.

    ``Prior.from_per_tensor``: ``scalar`` takes the mean over the subset's tensors, ``normgroups`` the
    mean within each group (``groups``: ``Laplace.prior_groups``); ``diagonal`` expands per-tensor values.
    """
    params = list(model.parameters())
    idx = subset_tensor_indices(model, subset_params)
    prior = _subset_prior(structure, subset_params, groups)
    if module_prior.numel() == len(params):  # one per tensor
        return prior.from_per_tensor(module_prior[idx]).log()
    if structure != "diagonal":
        raise ValueError(f"prior.structure={structure!r} cannot start from a per-parameter prior; allowed: ['diagonal']")
    offsets = torch.tensor([0] + [p.numel() for p in params]).cumsum(0)
    return torch.cat([module_prior[offsets[i]:offsets[i + 1]] for i in idx]).log()


def write_prior(module_prior: torch.Tensor, model: nn.Module, subset_params: list[torch.Tensor],
                structure: str, prior: torch.Tensor, groups: torch.Tensor | None = None) -> torch.Tensor:
    """Return the module's prior buffer with the subset's entries replaced by ``prior``
    (engine shape; ``normgroups``: each tensor gets its group's value, ``groups`` as in
    ``initial_log_prior``); tensors outside the subset keep their precision."""
    params = list(model.parameters())
    idx = subset_tensor_indices(model, subset_params)
    prior = prior.detach().to(module_prior)
    if structure != "diagonal":
        new = module_prior.clone()
        new[idx] = _subset_prior(structure, subset_params, groups).per_tensor(prior)
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
