"""Which parameters the Laplace approximation covers, grouped by the module that owns them.

``Entry(module, names, params)``: one module and the names of its own (direct) parameters in the
subset, in ``model.parameters()`` order. ``subset_of_weights="all"``: every parameter that requires
grad; ``"last_layer"``: the last ``nn.Linear`` in module order (or ``last_layer_name``), weight then
bias. The flat parameter vector of the subset is the concatenation of ``p.flatten()`` in this
order; "layerwise" priors have one precision per parameter tensor in this order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from laplace_lab.laplace.options import SubsetOfWeights

SUBSETS = SubsetOfWeights.values()


@dataclass
class Entry:
    module: nn.Module
    names: list[str]

    @property
    def params(self) -> list[torch.Tensor]:
        return [getattr(self.module, n) for n in self.names]


def find_last_layer(model: nn.Module, last_layer_name: str | None = None) -> tuple[str, nn.Linear]:
    if last_layer_name is not None:
        m = model.get_submodule(last_layer_name)
        if not isinstance(m, nn.Linear):
            raise ValueError(f"last_layer_name={last_layer_name!r} is a {type(m).__name__}, not nn.Linear")
        return last_layer_name, m
    last = None
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            last = (name, m)
    if last is None:
        raise ValueError("subset_of_weights='last_layer' needs an nn.Linear in the model; none found")
    return last


def select(model: nn.Module, subset: str, last_layer_name: str | None = None) -> list[Entry]:
    if subset == "last_layer":
        _, m = find_last_layer(model, last_layer_name)
        names = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        return [Entry(m, names)]
    if subset != "all":
        raise ValueError(f"subset_of_weights must be one of {SUBSETS}; got {subset!r}")
    entries, seen = [], set()
    for m in model.modules():
        names = []
        for n, p in m.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                names.append(n)
        if names:
            entries.append(Entry(m, names))
    if not entries:
        raise ValueError("the model has no parameters that require grad")
    return entries
