"""Capture module inputs and back-propagate output-space factors to module outputs.

Hand-written with module forward hooks and one (vmapped) ``torch.autograd.grad`` call: it is the
single backward pass every structure shares, and it never forms per-sample parameter gradients.

``Capture(modules)`` is a context manager; during the forward it records, for every call of each
watched module, its positional inputs (detached), keyword inputs and output. ``backward(f, V)``
then returns, per module and per call, ``g`` of shape ``[K, *output.shape]`` = ``V[k]``
back-propagated to that call's output (``V``: ``[K, *f.shape]``). With ``K > 1`` the K backward
passes are batched with ``is_grads_batched`` (vmap over the backward graph).

In-place safety: with ``protect_inplace=True`` the hook returns ``output + 0`` to the rest of the
network and keeps the original tensor, so in-place activations after a layer
(``ReLU(inplace=True)``) cannot corrupt the recorded output's gradient. That copy costs a full
pass over every layer output, so ``protect_inplace="auto"`` (the default) skips it when no module
of the model declares ``inplace=True`` and records each output's version counter instead;
``modified_inplace()`` then tells whether anything (e.g. a functional ``x.relu_()`` or
``out += identity``) wrote into a recorded output, and the caller redoes the forward protected.

Backward: for ``K > 1`` a loop of ``K`` ``autograd.grad`` calls on the retained graph was measured
faster on CPU than one vmapped call (``is_grads_batched``) for LeNet-5 (the vmap rules of
conv/pool backward add copies); ``batched_backward`` switches (default: loop on CPU, vmap else).
``Laplace.fit`` uses this path only for models ``chain.Chain`` cannot run (anything but a plain
``nn.Sequential`` of known modules); the chain back-propagates all ``K`` factors as one batch.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn


class Call:
    """One call of a watched module: inputs (detached unless ``Capture(detach_inputs=False)``), output and, after ``backward``, the output
    gradients of the ``K`` factors: ``grads`` (a list of ``K`` tensors shaped like the output, as
    the per-factor backward produced them) or ``grad`` (``[K, *output.shape]``; stacked lazily,
    sample-major in memory, on first access; may also be assigned directly).

    ``pooled`` (set by ``chain.Chain`` for a Conv2d followed by a non-overlapping max-pool): the
    same gradients in compressed form ``(v, idx)``: ``v`` ``[N, K, C, P]`` the values at the ``P``
    pooled positions, ``idx`` ``[N, C, P]`` their flat positions in the ``H W`` output map (every
    other entry is zero). ``grad`` / ``grads`` scatter them into the dense tensor on first access;
    the kernels in ``modules`` use ``pooled`` directly where that is cheaper.

    ``s2d`` (set by ``chain.Chain`` for a Conv2d whose backward runs in 2x2 space-to-depth form):
    the dense gradient ``[N, K, C, H W]`` with its positions in 2x2-block order (``(qy, qx, a, b)``
    for ``y = 2 a + qy``, ``x = 2 b + qx``); ``grad`` reorders it on first access."""

    __slots__ = ("args", "kwargs", "_output", "_output_fn", "_out_shape", "version", "_grad", "_grads", "node",
                 "pooled", "s2d", "__weakref__")

    def __init__(self, args: tuple, kwargs: dict, output: torch.Tensor | None, grad: torch.Tensor | None = None,
                 version: int = -1, output_fn=None, out_shape: torch.Size | None = None):
        self.args, self.kwargs = args, kwargs
        self._output, self._output_fn = output, output_fn  # output_fn: computes it on first access
        self._out_shape = out_shape
        self.version = version  # output._version when recorded (unprotected capture)
        self._grad = grad
        self._grads = None
        self.pooled = None
        self.s2d = None
        self.node = None  # the output's grad_fn (set by Capture; kept when the output itself is not)

    @property
    def output(self) -> torch.Tensor:
        if self._output is None and self._output_fn is not None:
            self._output, self._output_fn = self._output_fn(), None
        return self._output

    @output.setter
    def output(self, value: torch.Tensor) -> None:
        self._output, self._output_fn = value, None

    @property
    def out_shape(self) -> torch.Size:
        """The output's shape (without computing a lazily given output)."""
        return self._out_shape if self._out_shape is not None else self.output.shape

    @property
    def stacked_grad(self) -> torch.Tensor | None:
        """The ``[K, *output.shape]`` gradient if it is already held stacked (no conversion), else ``None``."""
        return self._grad

    @property
    def grad(self) -> torch.Tensor | None:
        if self._grad is None and self._grads is not None:
            # [N, K, ...] memory seen as [K, N, ...]: (K, N) merges and per-sample regrouping
            # stay views (``modules.flat_kn``)
            self._grad = torch.stack(self._grads, 1).transpose(0, 1)
        if self._grad is None and self.pooled is not None:
            v, idx = self.pooled
            N, K, C, P = v.shape
            dense = v.new_zeros(N, K, C, self.out_shape[2:].numel())
            dense.scatter_(3, idx[:, None].expand(N, K, C, P), v)
            self._grad = dense.view(N, K, *self.out_shape[1:]).transpose(0, 1)
        if self._grad is None and self.s2d is not None:
            N, K, C = self.s2d.shape[:3]
            H, W = self.out_shape[2:]
            g = self.s2d.view(N, K, C, 2, 2, H // 2, W // 2).permute(0, 1, 2, 5, 3, 6, 4)
            self._grad = g.reshape(N, K, C, H, W).transpose(0, 1)
        return self._grad

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        self._grad, self._grads, self.pooled, self.s2d = value, None, None, None

    @property
    def grads(self) -> list[torch.Tensor] | None:
        if self._grads is None and (self._grad is not None or self.pooled is not None or self.s2d is not None):
            return list(self.grad.unbind(0))
        return self._grads

    @grads.setter
    def grads(self, value: list[torch.Tensor]) -> None:
        self._grad, self._grads, self.pooled, self.s2d = None, list(value), None, None


class Streamed:
    """A batch whose curvature reaches the structure during the backward (``Capture.stream``): call
    ``run(accumulate)`` once; it back-propagates and calls ``accumulate(records, first)`` with records
    holding groups of calls with one factor's output gradients (``first``: the first factor, whose
    groups also count the statistics of the inputs)."""

    def __init__(self, run):
        self.run = run


def graph_nodes(root, leaf: torch.Tensor) -> tuple[set, set]:
    """``(below, reaching)``: the autograd nodes below ``root`` (a ``grad_fn``), and those of them from
    which ``leaf`` (a tensor requiring grad) is reached. A tensor whose ``grad_fn`` is not in ``below``
    gets no gradient from ``root``; one whose ``grad_fn`` is in ``reaching`` depends on ``leaf``."""
    parents: dict = {}
    target, seen, stack = None, {root}, [root]
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents.setdefault(child, []).append(node)
            if getattr(child, "variable", None) is leaf:
                target = child
            if child not in seen:
                seen.add(child)
                stack.append(child)
    out: set = set()
    stack = [target] if target is not None else []
    while stack:
        for parent in parents.get(stack.pop(), ()):
            if parent not in out:
                out.add(parent)
                stack.append(parent)
    return seen, out


@dataclass
class Record:
    module: nn.Module
    calls: list[Call] = field(default_factory=list)


def has_inplace_modules(model: nn.Module) -> bool:
    """Whether any submodule declares ``inplace=True`` (ReLU, Dropout, Hardtanh, ...)."""
    return any(getattr(m, "inplace", False) is True for m in model.modules())


class Capture:
    def __init__(self, modules: list[nn.Module], protect_inplace: bool = True,
                 batched_backward: bool | None = None, grad_hooks: bool = False, detach_inputs: bool = True,
                 stream: bool = False):
        self.detach_inputs = detach_inputs  # False: recorded inputs keep their graph (differentiable re-use)
        # stream: for ``stream`` only. Outputs are not kept (their shape and grad_fn are); a tensor hook
        # registered when the module returns hands ``stream`` the gradient (as for grad_hooks, a later
        # in-place op does not change what it sees). Saves the outputs that autograd does not keep.
        self.stream_mode = stream
        self._sink = None  # set by ``stream`` while it back-propagates
        self._silent: list = []  # (record index, call) without a gradient from f (``can_stream``)
        self.records = [Record(m) for m in modules]
        self._handles: list = []
        self.protect_inplace = protect_inplace
        self.batched_backward = batched_backward
        # grad_hooks: a tensor hook on every recorded output appends the gradient that the
        # caller's own backward sends through it to ``call.grads`` (K = 1). Registered when the
        # module returns, so a later in-place op cannot change what it sees (PyTorch's documented
        # semantics for hooks registered before an in-place modification).
        self.grad_hooks = grad_hooks

    def _hook(self, record: Record, index: int):
        def hook(module, args, kwargs, output):
            if not isinstance(output, torch.Tensor):
                raise NotImplementedError(
                    f"module {type(module).__name__} returns {type(output).__name__}; "
                    "the Laplace engine needs modules with parameters to return one tensor"
                )
            if self.detach_inputs:
                args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            if self.stream_mode:
                call = Call(args, kwargs, None, out_shape=output.shape)
                call.node = output.grad_fn
                record.calls.append(call)
                if output.requires_grad:  # weak references: the hook lives on the graph node, which the
                    # call holds (``node``), so strong ones would form a cycle through C++ that
                    # Python's collector cannot see, leaking every batch's inputs and graph
                    cap_ref, call_ref = weakref.ref(self), weakref.ref(call)

                    def deliver(g):
                        cap, c = cap_ref(), call_ref()
                        if cap is not None and c is not None:
                            cap._deliver(index, c, g)

                    output.register_hook(deliver)
                return None
            call = Call(args, kwargs, output)
            call.node = output.grad_fn
            record.calls.append(call)
            if self.grad_hooks and output.requires_grad:
                # a weak reference: the hook lives on the output (held from C++, which Python's
                # collector cannot see), so a strong one would form an uncollectable cycle
                # output -> hook -> Call -> output, leaking every batch's outputs and graph
                ref = weakref.ref(call)

                def tensor_hook(g):
                    c = ref()
                    if c is not None:
                        c.grads = [g.detach()]

                output.register_hook(tensor_hook)
                return None
            if self.protect_inplace and output.requires_grad:
                return output + 0
            call.version = output._version
            return None

        return hook

    def __enter__(self) -> Capture:
        for i, r in enumerate(self.records):
            r.calls.clear()
            self._handles.append(r.module.register_forward_hook(self._hook(r, i), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def modified_inplace(self) -> bool:
        """True if an unprotected recorded output was written in place after its module returned."""
        return any(c.version >= 0 and c.output._version != c.version for r in self.records for c in r.calls)

    def _deliver(self, index: int, call: Call, g: torch.Tensor) -> None:
        if self._sink is not None:
            self._sink(index, call, g.detach().unsqueeze(0))

    def can_stream(self, f: torch.Tensor, source: torch.Tensor) -> bool:
        """Whether ``stream`` sees every recorded output's gradient: each output that gets one from
        ``f`` depends on ``source`` (the backward w.r.t. ``source`` passes through it). Notes the calls
        that get none (no grad, or no path to ``f``: zero gradients) for ``stream``."""
        if f.grad_fn is None or not source.requires_grad:
            return False
        below, reaching = graph_nodes(f.grad_fn, source)
        calls = [(i, c) for i, r in enumerate(self.records) for c in r.calls]
        self._silent = [(i, c) for i, c in calls if c.node is None or c.node not in below]
        return all(c.node in reaching for i, c in calls if (i, c) not in self._silent)

    def stream(self, f: torch.Tensor, V: torch.Tensor, source: torch.Tensor, accumulate, budget: int) -> None:
        """Back-propagate the ``K`` factors one at a time (``V`` ``[K, *f.shape]``) w.r.t. ``source``
        (a model input requiring grad; ``can_stream`` was true), taking each recorded output's
        gradient as it arrives (tensor hooks: registered now, or by a ``Capture(stream=True)``
        forward). A module's record is complete once all its calls' gradients of the factor are in
        (calls without one get zeros first); whenever complete records hold ``budget`` elements, and
        after each factor, ``accumulate(records, first)`` gets them (calls with ``grad``
        ``[1, *output]``; the other records empty) and their gradients are dropped. So about
        ``budget`` elements of output gradients (plus the modules still waiting for a call's) are
        alive instead of ``K`` times the activations."""
        K = V.shape[0]
        held: dict[int, list] = {}  # record index -> its calls whose gradient has arrived
        state = {"size": 0, "first": True}

        def flush(final: bool) -> None:
            done = [i for i, got in held.items() if final or len(got) == len(self.records[i].calls)]
            if not done:
                return
            parts = [Record(r.module) for r in self.records]
            for i in done:
                parts[i].calls = self.records[i].calls
            accumulate(parts, state["first"])
            for i in done:
                for c in held.pop(i):
                    state["size"] -= c.grad.numel()
                    c.grad = None

        def take(i, c, g) -> None:
            c.grad = g
            held.setdefault(i, []).append(c)
            state["size"] += g.numel()
            if state["size"] >= budget:
                flush(final=False)

        silent = {id(c) for _, c in self._silent}
        handles = [] if self.stream_mode else [
            c.output.register_hook(lambda g, i=i, c=c: self._deliver(i, c, g))
            for i, r in enumerate(self.records) for c in r.calls if id(c) not in silent]
        self._sink = take
        try:
            for k in range(K):
                state["first"] = k == 0
                for i, c in self._silent:
                    take(i, c, torch.zeros((1, *c.out_shape), dtype=V.dtype, device=V.device))
                torch.autograd.grad(f, source, grad_outputs=V[k], retain_graph=k < K - 1)
                flush(final=True)
        finally:
            self._sink = None
            for h in handles:
                h.remove()

    def backward(self, f: torch.Tensor, V: torch.Tensor, retain_graph: bool = False) -> None:
        """Fill ``call.grad`` / ``call.grads`` for every recorded call; ``V``: [K, *f.shape]."""
        calls = [c for r in self.records for c in r.calls]
        K = V.shape[0]
        direct = [c for c in calls if c.output is f]
        for c in direct:
            c.grad = V
        rest = [c for c in calls if c.output is not f]
        if not rest:
            return
        outs = [c.output for c in rest]
        batched = self.batched_backward
        if batched is None:
            batched = V.device.type != "cpu"
        if K == 1 or not batched:
            per_k = [torch.autograd.grad(f, outs, grad_outputs=V[k], allow_unused=True,
                                         retain_graph=retain_graph or k < K - 1)
                     for k in range(K)]
            for i, c in enumerate(rest):  # kept per factor: list-aware consumers never stack them
                if per_k[0][i] is None:
                    c.grad = torch.zeros((K, *c.output.shape), dtype=V.dtype, device=V.device)
                else:
                    c.grads = [gk[i] for gk in per_k]
            return
        else:
            grads = torch.autograd.grad(
                f, outs, grad_outputs=V, is_grads_batched=True, allow_unused=True, retain_graph=retain_graph
            )
        for c, g in zip(rest, grads):
            c.grad = torch.zeros((K, *c.output.shape), dtype=V.dtype, device=V.device) if g is None else g
