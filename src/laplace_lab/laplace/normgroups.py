"""Normalised groups of weights (Antoran et al. 2022, recommendation 2).

A normalisation layer (BatchNorm*, LayerNorm, GroupNorm) makes the network output invariant to
rescaling ``(W, b) -> k (W, b)``, ``k > 0``, of the Linear / Conv layer whose output it normalises
(for BatchNorm in eval mode: together with its running statistics). The linearised Laplace
evidence and predictive respect that invariance only if each such group has its own prior
precision (their Proposition 3: rescaling the group by ``k`` is matched by its precision / k^2).

``normgroups(model, params)`` returns the group index of every parameter tensor in ``params``
(the Laplace subset order): ``0`` for the tensors outside any normalised group ("the rest"; the
group may be empty) and ``1 .. G`` for the groups, numbered by their first tensor in ``params``.
A group holds the weight and the bias of the Linear / Conv layer(s) whose output tensor is the
input of one normalisation module (layers feeding several norm modules, e.g. by weight sharing,
merge their groups). Only *direct*, exclusive feeding counts: a residual sum ``conv(x) + shortcut``
that is normalised afterwards is not detected (a pre-activation residual stream read only through
norm layers is jointly scale invariant, but only as a whole), nor is a layer whose output is also
used elsewhere (e.g. a stem feeding both a norm and an identity shortcut).

Detection: a forward trace with hooks on ``example_input`` (``[B, ...]``): a Linear / Conv is
grouped if every one of its calls produced a tensor that a norm module received as its input and
that nothing else consumed (checked on the autograd graph of the trace).
Without ``example_input`` an input is guessed from the first Linear / Conv (features, or channels
x 32 x 32); when that forward fails the registration order is used instead (a norm module
directly after a Linear / Conv leaf module, the ``nn.Sequential`` convention).

Hand-written (a few dozen lines; no library detects normalised groups).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from laplace_lab.laplace.modules import eval_with_hooks

NORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)
LINEAR_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.modules.conv._ConvNd)


def _leaves(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if not list(m.children())]


def _guess_input(model: nn.Module) -> torch.Tensor | None:
    p = next(model.parameters())
    for m in model.modules():
        if isinstance(m, nn.Linear):
            return torch.zeros(2, m.in_features, device=p.device, dtype=p.dtype)
        if isinstance(m, nn.modules.conv._ConvNd):
            spatial = (32,) * (m.weight.ndim - 2)
            return torch.zeros(2, m.in_channels, *spatial, device=p.device, dtype=p.dtype)
    return None


def _consumers(out) -> dict:
    """Autograd node -> set of nodes that consume its output, for the graph of ``out``."""
    roots = [t.grad_fn for t in (out if isinstance(out, (tuple, list)) else (out,))
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    cons: dict = {}
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None:
                cons.setdefault(nxt, set()).add(node)
                stack.append(nxt)
    return cons


def _trace(model: nn.Module, x) -> list[set[int]]:
    """Feeding sets: per norm module, the ids of the Linear/Conv modules whose output is that norm
    module's input *and nothing else's* (checked on the autograd graph: the output's only consumer
    is the norm module's node; a tensor also used e.g. in a residual sum is not invariant)."""
    produced: dict[int, tuple[nn.Module, torch.Tensor]] = {}  # id(output) -> (module, output)
    calls: dict[int, int] = {}
    fed: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []  # (module id, norm id, input, norm output)

    def lin_hook(module, args, output):
        produced[id(output)] = (module, output)
        calls[id(module)] = calls.get(id(module), 0) + 1

    def norm_hook(module, args, output):
        if args and isinstance(args[0], torch.Tensor) and id(args[0]) in produced:
            src, t = produced[id(args[0])]
            if t is args[0]:
                fed.append((id(src), id(module), t, output))

    hooks = [(m, lin_hook if isinstance(m, LINEAR_TYPES) else norm_hook) for m in model.modules()
             if isinstance(m, LINEAR_TYPES + NORM_TYPES)]
    with eval_with_hooks(model, hooks), torch.enable_grad():
        out = model(x)
    cons = _consumers(out)
    ok: dict[int, int] = {}
    norms: dict[int, set[int]] = {}
    for mid, nid, t, o in fed:
        if t.grad_fn is not None and cons.get(t.grad_fn, set()) != {o.grad_fn}:
            continue  # used elsewhere too
        ok[mid] = ok.get(mid, 0) + 1
        norms.setdefault(mid, set()).add(nid)
    return _merge([(mid, norms[mid]) for mid in ok if ok[mid] >= calls.get(mid, 0)])


def _static(model: nn.Module) -> list[set[int]]:
    leaves = _leaves(model)
    sets = [(id(a), {id(b)}) for a, b in zip(leaves, leaves[1:])
            if isinstance(a, LINEAR_TYPES) and isinstance(b, NORM_TYPES)]
    return _merge(sets)


def _merge(pairs: list[tuple[int, set[int]]]) -> list[set[int]]:
    """Groups of feeding modules: two modules are in one group if they feed a common norm module."""
    groups: list[tuple[set[int], set[int]]] = []  # (modules, norms)
    for mid, norms in pairs:
        hit = [g for g in groups if g[1] & norms]
        mods, ns = {mid}, set(norms)
        for g in hit:
            mods |= g[0]
            ns |= g[1]
            groups.remove(g)
        groups.append((mods, ns))
    return [g[0] for g in groups]


def normgroups(model: nn.Module, params: list[torch.Tensor] | None = None,
               example_input: torch.Tensor | None = None) -> torch.Tensor:
    """Group index per parameter tensor of ``params`` (default: every parameter requiring grad),
    a long tensor ``[n_layers]``: 0 = not normalised, 1.. = normalised groups (module docstring)."""
    params = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    x = example_input if example_input is not None else _guess_input(model)
    sets = None
    if x is not None:
        try:
            sets = _trace(model, x)
        except Exception as err:  # noqa: BLE001 - any forward failure: fall back to module order
            if example_input is not None:
                raise
            warnings.warn(f"normgroups: forward trace on a guessed input failed ({err}); using module "
                          "registration order (pass example_input for a traced detection)", stacklevel=2)
    if sets is None:
        sets = _static(model)
    owner: dict[int, int] = {}  # id(param) -> provisional group (position in sets) + 1
    by_id = {id(m): m for m in model.modules()}
    for gi, mods in enumerate(sets):
        for mid in mods:
            for p in by_id[mid].parameters(recurse=False):
                owner[id(p)] = gi + 1
    out, renumber = [], {}
    for p in params:
        g = owner.get(id(p), 0)
        if g and g not in renumber:
            renumber[g] = len(renumber) + 1
        out.append(renumber.get(g, 0))
    return torch.as_tensor(out, dtype=torch.long)


def n_groups(groups: torch.Tensor) -> int:
    """Number of prior precisions for ``groups`` (the rest group 0 always counts)."""
    return int(groups.max()) + 1 if groups.numel() else 1


__all__ = ["normgroups", "n_groups", "NORM_TYPES", "LINEAR_TYPES"]
