"""Capture module inputs and back-propagate output-space factors to module outputs.

Hand-written with module forward hooks and one (vmapped) ``torch.autograd.grad`` call: it is the
single backward pass every structure shares, and it never forms per-sample parameter gradients.

``Capture(modules)`` is a context manager; during the forward it records, for every call of each
watched module, its positional inputs (detached), keyword inputs and output. ``backward(f, V)``
then returns, per module and per call, ``g`` of shape ``[K, *output.shape]`` = ``V[k]``
back-propagated to that call's output (``V``: ``[K, *f.shape]``). With ``K > 1`` the K backward
passes are batched with ``is_grads_batched`` (vmap over the backward graph).

In-place safety: the hook returns ``output + 0`` to the rest of the network and keeps the
original tensor, so in-place activations after a layer (``ReLU(inplace=True)``) cannot corrupt
the recorded output's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Call:
    args: tuple
    kwargs: dict
    output: torch.Tensor
    grad: torch.Tensor | None = None  # [K, *output.shape] after backward


@dataclass
class Record:
    module: nn.Module
    calls: list[Call] = field(default_factory=list)


class Capture:
    def __init__(self, modules: list[nn.Module], protect_inplace: bool = True):
        self.records = [Record(m) for m in modules]
        self._handles: list = []
        self.protect_inplace = protect_inplace

    def _hook(self, record: Record):
        def hook(module, args, kwargs, output):
            if not isinstance(output, torch.Tensor):
                raise NotImplementedError(
                    f"module {type(module).__name__} returns {type(output).__name__}; "
                    "the Laplace engine needs modules with parameters to return one tensor"
                )
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            record.calls.append(Call(args, kwargs, output))
            if self.protect_inplace and output.requires_grad:
                return output + 0
            return None

        return hook

    def __enter__(self) -> Capture:
        for r in self.records:
            r.calls.clear()
            self._handles.append(r.module.register_forward_hook(self._hook(r), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def backward(self, f: torch.Tensor, V: torch.Tensor) -> None:
        """Fill ``call.grad`` ([K, *output.shape]) for every recorded call; ``V``: [K, *f.shape]."""
        calls = [c for r in self.records for c in r.calls]
        K = V.shape[0]
        direct = [c for c in calls if c.output is f]
        for c in direct:
            c.grad = V
        rest = [c for c in calls if c.output is not f]
        if not rest:
            return
        outs = [c.output for c in rest]
        if K == 1:
            grads = torch.autograd.grad(f, outs, grad_outputs=V[0], allow_unused=True)
            grads = [None if g is None else g[None] for g in grads]
        else:
            grads = torch.autograd.grad(
                f, outs, grad_outputs=V, is_grads_batched=True, allow_unused=True
            )
        for c, g in zip(rest, grads):
            c.grad = torch.zeros((K, *c.output.shape), dtype=V.dtype, device=V.device) if g is None else g
