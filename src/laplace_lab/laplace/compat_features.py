"""laplace-torch's ``FeatureExtractor`` utility over any model with a linear last layer.

``FeatureExtractor(model, last_layer_name=None, enable_backprop=False, feature_reduction=None)``:
``forward(x)`` is the model's output; ``forward_with_features(x)`` returns ``(output, phi)`` with
``phi`` the input of the last layer (``[B, E]``; a ``[B, ..., E]`` input is reduced by
``feature_reduction``: "pick_first" / "pick_last" take the first / last position over the middle
dimensions, "average" their mean). Without ``last_layer_name`` the first forward finds the last
layer: the last leaf module that ran, which must be an ``nn.Linear``. The engine itself does not
use this class (its last-layer Laplace captures the last layer's input during its own forward).
"""

from __future__ import annotations

import torch
from torch import nn

from laplace_lab.laplace.options import FeatureReduction, check_choice


def reduce_features(phi: torch.Tensor, reduction: str | None) -> torch.Tensor:
    """``[B, ..., E]`` -> ``[B, E]`` by ``reduction`` (``None`` or a 2-d ``phi``: unchanged)."""
    if reduction is None or phi.ndim <= 2:
        return phi
    rows = phi.reshape(phi.shape[0], -1, phi.shape[-1])  # [B, positions, E] (row-major positions)
    if reduction == FeatureReduction.PICK_FIRST:
        return rows[:, 0]
    if reduction == FeatureReduction.PICK_LAST:
        return rows[:, -1]
    return rows.mean(1)


def last_module_run(model: nn.Module, x) -> tuple[str, torch.Tensor | None, torch.Tensor]:
    """One forward of ``model`` on ``x`` recording which leaf modules run: ``(name of the last one,
    its input, the model's output)`` (laplace-torch's last-layer search)."""
    ran: list[tuple[str, torch.Tensor | None]] = []
    leaves = [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    if not leaves:
        raise ValueError("the model has no submodules: name its last layer with last_layer_name")

    def hook(name):
        def record(module, args, output):
            ran.append((name, args[0] if args and isinstance(args[0], torch.Tensor) else None))
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in leaves]
    try:
        out = model(x)
    finally:
        for h in handles:
            h.remove()
    if not ran:
        raise ValueError("no submodule ran in the model's forward: name its last layer with last_layer_name")
    return (*ran[-1], out)


class FeatureExtractor(nn.Module):
    """The model's output together with its last layer's input (see the module docstring)."""

    def __init__(self, model: nn.Module, last_layer_name: str | None = None, enable_backprop: bool = False,
                 feature_reduction: str | None = None):
        super().__init__()
        if feature_reduction is not None:
            feature_reduction = check_choice("feature_reduction", feature_reduction, FeatureReduction.values())
        self.model = model
        self.enable_backprop = bool(enable_backprop)
        self.feature_reduction = feature_reduction
        self.last_layer: nn.Module | None = None
        self.last_layer_name: str | None = None
        self._features: torch.Tensor | None = None
        self._handle = None
        if last_layer_name is not None:
            self.set_last_layer(last_layer_name)

    def set_last_layer(self, last_layer_name: str) -> None:
        """Use the module ``last_layer_name`` (an ``nn.Linear`` of ``model``) as the last layer."""
        modules = dict(self.model.named_modules())
        if last_layer_name not in modules:
            raise ValueError(f"last_layer_name={last_layer_name!r} is not a module of the model; "
                             f"allowed: {[n for n in modules if n]}")
        layer = modules[last_layer_name]
        if not isinstance(layer, nn.Linear):
            raise ValueError(f"the last layer {last_layer_name!r} must be an nn.Linear; got {type(layer).__name__}")
        if self._handle is not None:
            self._handle.remove()
        self.last_layer, self.last_layer_name = layer, last_layer_name
        self._handle = layer.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        a = args[0]
        self._features = a if self.enable_backprop else a.detach()

    def find_last_layer(self, x) -> torch.Tensor:
        """One forward recording which leaf modules run; the last one becomes the last layer.
        Returns the model's output."""
        if self.last_layer is not None:
            raise ValueError(f"the last layer is already set ({self.last_layer_name!r})")
        name, phi, out = last_module_run(self.model, x)
        self.set_last_layer(name)
        self._features = None if phi is None else (phi if self.enable_backprop else phi.detach())
        return out

    def forward(self, x) -> torch.Tensor:
        if self.last_layer is None:
            return self.find_last_layer(x)
        return self.model(x)

    def forward_with_features(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output, phi)``: ``phi`` the (reduced) input of the last layer in this forward."""
        out = self.forward(x)
        return out, reduce_features(self._features, self.feature_reduction)


__all__ = ["FeatureExtractor", "last_module_run", "reduce_features"]
