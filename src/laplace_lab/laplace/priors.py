"""Isotropic Gaussian priors: scalar, layerwise (one per parameter tensor), diagonal or normgroups.

``prior_precision`` is stored as a 1-d tensor: ``[1]`` (scalar), ``[n_layers]`` (layerwise,
``n_layers`` = number of parameter tensors in the subset), ``[P]`` (diagonal) or ``[n_groups]``
(normgroups: one per group of tensors made scale invariant by a normalisation layer, plus one for
the rest; see ``normgroups``; the structures see its per-tensor expansion).

``Prior`` owns a prior's structure, groups, expansions and the MAP penalty; ``Laplace`` (its
subset) and the training module (the whole model) both use it. ``per_layer`` / ``to_diag`` are the
expansions of the form the posterior structures take (``Prior.structure_form``).
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


def per_layer(prior: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``[n_layers]`` precisions from a scalar or layerwise prior."""
    return prior.expand(len(sizes)) if prior.numel() == 1 else prior


def logdet_diag_by_tensor(diag: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``[L]``: the log det of a ``[P]`` diagonal precision, summed over each parameter tensor's entries."""
    return torch.stack([x.log().sum() for x in diag.split(sizes)])


def to_diag(prior: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``[P]`` per-parameter precisions from a scalar, layerwise or diagonal prior."""
    if prior.numel() == 1:
        return prior.expand(sum(sizes))
    if prior.numel() == len(sizes):
        return torch.repeat_interleave(prior, torch.as_tensor(sizes, device=prior.device))
    return prior


class Prior:
    """A zero-mean isotropic-per-block Gaussian prior over ``L`` parameter tensors of ``sizes`` (``P``
    parameters): its structure, the group of every tensor, and every expansion of its precisions.

    ``values`` (the precisions, e.g. ``Laplace.prior_precision`` or ``exp`` of the learnt logs) have
    ``n_values`` entries: ``1`` (scalar), ``L`` (layerwise), ``P`` (diagonal) or ``n_groups``
    (normgroups: ``groups`` ``[L]`` is the group index of every tensor, see ``normgroups``).
    All methods keep the autograd graph of ``values``.
    """

    def __init__(self, structure: str, sizes: list[int], groups: torch.Tensor | None = None):
        if structure not in PRIOR_STRUCTURES:
            raise ValueError(f"prior_structure must be one of {PRIOR_STRUCTURES}; got {structure!r}")
        self.structure, self.sizes = structure, list(sizes)
        self.n_layers, self.n_params = len(self.sizes), sum(self.sizes)
        self.groups = None
        if structure == "normgroups":
            if groups is None:
                raise ValueError("prior_structure='normgroups' needs the group index of every parameter tensor")
            groups = torch.as_tensor(groups, dtype=torch.long).reshape(-1)
            if groups.numel() != self.n_layers or bool((groups < 0).any()):
                raise ValueError(f"prior_groups must hold one non-negative group index per parameter tensor "
                                 f"(n_layers={self.n_layers}); got shape {tuple(groups.shape)}")
            self.groups = groups

    @classmethod
    def for_model(cls, structure: str, model, params: list[torch.Tensor], groups=None,
                  example_input: torch.Tensor | None = None) -> Prior:
        """The prior over ``params`` of ``model``; normgroups detects ``groups`` when not given
        (``normgroups.normgroups`` traced on ``example_input``)."""
        if structure == "normgroups" and groups is None:
            from laplace_lab.laplace.normgroups import normgroups

            groups = normgroups(model, params, example_input).to(params[0].device if params else "cpu")
        return cls(structure, [p.numel() for p in params], groups)

    @property
    def n_groups(self) -> int | None:
        """Number of group precisions (normgroups; the rest group 0 always counts), else ``None``."""
        if self.groups is None:
            return None
        return int(self.groups.max()) + 1 if self.groups.numel() else 1

    @property
    def n_values(self) -> int:
        return {"scalar": 1, "layerwise": self.n_layers, "diagonal": self.n_params,
                "normgroups": self.n_groups}[self.structure]

    @property
    def expanded_structure(self) -> str:
        """The structure of ``structure_form`` (normgroups reaches the posterior structures layerwise)."""
        return "layerwise" if self.structure == "normgroups" else self.structure

    def tensor_index(self) -> torch.Tensor | None:
        """``[L]`` long: the entry of ``values`` every tensor uses; ``None`` for a diagonal prior."""
        if self.structure == "diagonal":
            return None
        if self.structure == "scalar":
            return torch.zeros(self.n_layers, dtype=torch.long)
        if self.structure == "normgroups":
            return self.groups
        return torch.arange(self.n_layers)

    # ---- shapes -------------------------------------------------------------------------------
    def vector(self, values, *, device=None, dtype=None) -> torch.Tensor:
        """Validate ``values`` (a number or tensor; one entry broadcasts) as the 1-d ``[n_values]`` tensor."""
        t = values if isinstance(values, torch.Tensor) else torch.as_tensor(values, dtype=dtype)
        t = t.to(device=device, dtype=dtype).reshape(-1)
        want = self.n_values
        if t.numel() == 1 and want != 1:
            t = t.expand(want)
        if t.numel() != want:
            raise ValueError(f"prior_precision has {t.numel()} entries; prior_structure={self.structure!r} needs {want}")
        return t

    def structure_form(self, values: torch.Tensor) -> torch.Tensor:
        """What the posterior structures take: ``values``, or for normgroups the ``[L]`` per-tensor expansion."""
        return self.per_tensor(values) if self.structure == "normgroups" else values

    def per_tensor(self, values: torch.Tensor) -> torch.Tensor:
        """``[L]`` precision of every tensor (not for a diagonal prior)."""
        if self.structure == "diagonal":
            raise ValueError("a diagonal prior has no per-tensor precision")
        return values[self.tensor_index().to(values.device)]

    def per_parameter(self, values: torch.Tensor) -> torch.Tensor:
        """``[P]`` precision of every parameter."""
        return to_diag(self.structure_form(values), self.sizes)

    def from_per_tensor(self, per_tensor: torch.Tensor) -> torch.Tensor:
        """``[n_values]`` values from ``[L]`` per-tensor precisions: scalar the mean, layerwise as is,
        normgroups the mean within each group (an empty group: the overall mean), diagonal expanded."""
        if self.structure == "diagonal":
            return torch.repeat_interleave(per_tensor, torch.as_tensor(self.sizes, device=per_tensor.device))
        if self.structure == "scalar":
            return per_tensor.mean().reshape(1)
        if self.structure == "layerwise":
            return per_tensor
        groups = self.groups.to(per_tensor.device)
        n = self.n_groups
        total = torch.zeros(n, dtype=per_tensor.dtype, device=per_tensor.device).index_add_(0, groups, per_tensor)
        count = torch.zeros(n, dtype=per_tensor.dtype, device=per_tensor.device).index_add_(
            0, groups, torch.ones_like(per_tensor))
        return torch.where(count > 0, total / count.clamp_min(1), per_tensor.mean())

    # ---- the MAP objective --------------------------------------------------------------------
    def penalty(self, values: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """``0.5 sum_i delta_i theta_i^2`` over ``params`` (the ``L`` tensors): the negative log prior
        without its normaliser, as the MAP loss uses it (per tensor via squared norms, no ``[P]`` copy)."""
        if self.structure == "diagonal":
            theta = torch.cat([p.flatten() for p in params])
            return 0.5 * (values * theta.pow(2)).sum()
        sq_norms = torch.stack([p.pow(2).sum() for p in params])
        delta = values if self.structure == "layerwise" else self.per_tensor(values)
        return 0.5 * (delta * sq_norms).sum()
