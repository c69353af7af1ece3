"""Isotropic Gaussian priors: scalar, layerwise (one per parameter tensor), diagonal or normgroups.

``prior_precision`` is stored as a 1-d tensor: ``[1]`` (scalar), ``[n_layers]`` (layerwise,
``n_layers`` = number of parameter tensors in the subset), ``[P]`` (diagonal) or ``[n_groups]``
(normgroups: one per group of tensors made scale invariant by a normalisation layer, plus one for
the rest; see ``normgroups``; the structures see its per-tensor expansion).
"""

from __future__ import annotations

import torch

from laplace_lab.laplace.options import PriorStructure

PRIOR_STRUCTURES = PriorStructure.values()


def infer_structure(prior_precision, n_layers: int, n_params: int) -> str:
    t = torch.as_tensor(prior_precision)
    if t.ndim == 0 or t.numel() == 1:
        return "scalar"
    if t.ndim == 1 and t.numel() == n_layers:
        return "layerwise"
    if t.ndim == 1 and t.numel() == n_params:
        return "diagonal"
    raise ValueError(
        f"prior_precision has shape {tuple(t.shape)}; expected a float or a 1-d tensor of length "
        f"1, n_layers={n_layers} or n_params={n_params}"
    )


def to_vector(prior_precision, structure: str, n_layers: int, n_params: int, *, device, dtype,
              n_groups: int | None = None) -> torch.Tensor:
    """Validate and convert to the stored 1-d tensor (keeps the autograd graph); ``n_groups``
    is needed for ``normgroups``."""
    if structure not in PRIOR_STRUCTURES:
        raise ValueError(f"prior_structure must be one of {PRIOR_STRUCTURES}; got {structure!r}")
    t = prior_precision if isinstance(prior_precision, torch.Tensor) else torch.as_tensor(prior_precision, dtype=dtype)
    t = t.to(device=device, dtype=dtype).reshape(-1)
    want = {"scalar": 1, "layerwise": n_layers, "diagonal": n_params, "normgroups": n_groups}[structure]
    if want is None:
        raise ValueError("prior_structure='normgroups' needs n_groups")
    if t.numel() == 1 and want != 1:
        t = t.expand(want)
    if t.numel() != want:
        raise ValueError(
            f"prior_precision has {t.numel()} entries; prior_structure={structure!r} needs {want}"
        )
    return t


def per_layer(prior: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``[n_layers]`` precisions from a scalar or layerwise prior."""
    return prior.expand(len(sizes)) if prior.numel() == 1 else prior


def expand_groups(prior: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``[n_layers]`` per-tensor precisions from ``[n_groups]`` group precisions and the group
    index of every tensor ``groups`` ``[n_layers]`` (keeps the autograd graph)."""
    return prior[groups.to(prior.device)]


def to_diag(prior: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``[P]`` per-parameter precisions from a scalar, layerwise or diagonal prior."""
    if prior.numel() == 1:
        return prior.expand(sum(sizes))
    if prior.numel() == len(sizes):
        return torch.repeat_interleave(prior, torch.as_tensor(sizes, device=prior.device))
    return prior
