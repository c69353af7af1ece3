"""Memory and time plan of a Laplace before any work: the peak memory of ``fit``, of the glm
predictive per test input and of ``sample``, and the fit's time from one probed batch.

What a plan reads from the model: one forward of a single input with hooks (``ModelShape``: the
output size of every leaf module, and for each parameter-holding module of the subset its KFAC
sizes ``d_in`` / ``d_out``, output positions ``S`` and parameter count). What it reads from the
structure: its ``memory_plan`` classmethod (``structures.base.Structure.memory_plan``), which
states in bytes what the structure keeps (factors, diagonal, dense matrix, low-rank basis) and what
its accumulation, finalisation, predictive view and sampling allocate beside it; the part every
batch backend keeps per batch (activations, the ``K`` output factors' gradients of the recorded
modules, the cotangent in flight) is ``plan_terms.backend_batch_bytes``, shared by all structures. A
structure without ``memory_plan`` gets no plan (``None``) and no memory check.

Conventions: bytes; ``K`` = output factors (``output_factors.n_output_factors``), ``N`` = fit batch,
``C`` = network outputs, ``P`` = parameters in the subset, ``b`` = bytes per element of the model's
dtype. A plan is an estimate of live tensor memory (not of the allocator's caches, nor of the
interpreter and libraries): ``benchmarks/plan_accuracy.py`` compares it with measured peaks.

Streaming of output factors (``backends.capture.stream_factors``): ``fit_plan`` plans a fit on the CPU,
or without a budget, with the capture backend's constant rule (stream when the ``K`` factors'
gradients exceed ``FACTOR_BUDGET`` elements); on CUDA with a budget it plans the fit holding them all
and streams only when that peak exceeds ``memory_budget`` times the available memory. ``Laplace``
takes that decision from the plan of its first batch (``factor_streaming``).

Fit batch (``auto_fit_batch``, a run's ``curvature.fit_batch_size: auto``): on CUDA the largest
``base * 2^k`` up to a cap whose fit, planned holding every factor's gradients, fits the budget; on
the CPU ``base`` (a larger fit batch measured no faster there); ``mc_fisher`` keeps ``base`` (its
sampled labels are drawn per batch, so the batch changes the fit). The other curvature types sum
over the data, so the batch changes the fit only by float round-off.

``check_fit`` turns a plan into the early refusal of ``Laplace.fit``: where the predicted fit peak
exceeds ``memory_budget`` times the memory available (``available_memory``: CUDA
``mem_get_info`` plus the caching allocator's free blocks, else ``MemAvailable`` of
``/proc/meminfo``), a ``MemoryPlanError`` names the structure, its predicted size and the
(subset, structure) alternatives that fit, each with its size.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import MutableMapping
from dataclasses import dataclass

import torch
from torch import nn

from laplace_lab.laplace import checks
from laplace_lab.laplace.backends.capture import BUDGET_DEVICES, stream_factors
from laplace_lab.laplace.modules import eval_with_hooks, is_kfac_module
from laplace_lab.laplace.output_factors import n_output_factors
from laplace_lab.laplace.plan_terms import LayerShape, MemoryPlan, ModelShape
from laplace_lab.laplace.structures import STRUCTURES
from laplace_lab.laplace.subset import SUBSETS, select

DEFAULT_MEMORY_BUDGET = 0.9  # fraction of the available memory a fit may plan to use
FIT_TIME_OVERHEAD = 1.1  # stated overhead on probe time x batches (loader, first-batch effects)


class MemoryPlanError(MemoryError):
    """A fit or predictive whose planned peak memory exceeds the budget; raised before allocating."""


def human(n_bytes: float) -> str:
    """``n_bytes`` in binary units: ``'1.5 GiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n_bytes) < 1024 or unit == "PiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024
    raise AssertionError  # unreachable


# ---- probing a model -------------------------------------------------------------------------------
def _batch_size(x) -> int:
    """N of a batch: the leading size of ``x`` (a tensor) or of the first tensor of a mapping."""
    if isinstance(x, torch.Tensor):
        return max(1, x.shape[0]) if x.dim() else 1
    if isinstance(x, MutableMapping):
        return next((max(1, v.shape[0]) for v in x.values() if isinstance(v, torch.Tensor) and v.dim()), 1)
    raise ValueError(f"a plan needs a tensor or a dict batch to probe the model; got {type(x).__name__}")


def _numel(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    return sum(v.numel() for v in x.values() if isinstance(v, torch.Tensor))


def probe_model(model: nn.Module, x) -> dict:
    """One forward of the batch ``x`` (no grad, eval mode, hooks on every module), divided by its size N:
    the output elements per input of every module (by module id), the input's and the network output's
    size per input. The whole batch, not one input: a model may tie its forward to the batch (e.g. an
    augmentation with frozen noise of shape [N, ...])."""
    outs: dict[int, int] = {}
    N = _batch_size(x)
    def count(mod, args, out):
        outs[id(mod)] = out.numel() // N if isinstance(out, torch.Tensor) else 0

    with eval_with_hooks(model, [(m, count) for m in model.modules()]), torch.no_grad():
        out = model(x)
    checks.model_output(out, "the memory plan's probe")
    return {"outs": outs, "input": _numel(x) // N, "n_outputs": out.numel() // N}


def _layer(module: nn.Module, names: list[str], out_numel: int) -> LayerShape:
    numel = sum(getattr(module, n).numel() for n in names)
    if is_kfac_module(module):
        if isinstance(module, nn.Conv2d):
            d_in = module.in_channels // module.groups * math.prod(module.kernel_size)
            d_out = module.out_channels
        else:
            d_in, d_out = module.in_features, module.out_features
        return LayerShape(True, d_in, d_out, max(1, out_numel // d_out), numel, out_numel)
    return LayerShape(False, 0, 0, 1, numel, out_numel)


def shape_of(model: nn.Module, probe: dict, subset: str, last_layer_name: str | None = None,
             dtype: torch.dtype | None = None) -> ModelShape:
    """The ``ModelShape`` of ``model`` for ``subset`` from ``probe_model``'s result."""
    from laplace_lab.laplace.chain import Chain

    entries = select(model, subset, last_layer_name)
    outs = probe["outs"]
    leaves = [outs.get(id(m), 0) for m in model.modules() if not list(m.children())]
    dtype = dtype or next(model.parameters()).dtype
    return ModelShape(
        subset=subset,
        layers=tuple(_layer(e.module, e.names, outs.get(id(e.module), 0)) for e in entries),
        n_outputs=probe["n_outputs"],
        activations=probe["input"] + sum(leaves),
        widest=max([probe["input"], *leaves]),
        itemsize=torch.empty((), dtype=dtype).element_size(),
        chain=Chain.build(model, [e.module for e in entries], block_order_ok=True) is not None,
    )


# ---- plans -----------------------------------------------------------------------------------------
def structure_plan(struct_cls, shape: ModelShape, batch: int, n_factors: int,
                   options: dict | None = None) -> MemoryPlan | None:
    """``struct_cls.memory_plan`` (``None`` where the structure declares none); ``stream`` set from
    ``shape.streams``."""
    plan = struct_cls.memory_plan(shape, batch, n_factors, options or {})
    if plan is not None:
        plan.stream = shape.streams(batch, n_factors, struct_cls.factor_chunks)
    return plan


def fit_plan(struct_cls, shape: ModelShape, batch: int, n_factors: int, options: dict | None = None,
             device_type: str | None = None, limit: float | None = None) -> MemoryPlan | None:
    """``structure_plan`` with the capture backend's streaming decided as it will be: on
    ``BUDGET_DEVICES`` with a ``limit`` (bytes: ``memory_budget`` times the available memory), by
    ``stream_factors`` on the plan that holds every output factor's gradients (streamed only when
    that plan's fit peak exceeds ``limit``); elsewhere ``stream_factors``' constant rule."""
    if device_type not in BUDGET_DEVICES or limit is None or not shape.can_stream(struct_cls.factor_chunks):
        return structure_plan(struct_cls, shape, batch, n_factors, options)
    held = structure_plan(struct_cls, dataclasses.replace(shape, stream=False), batch, n_factors, options)
    if held is None or not stream_factors(n_factors * batch * shape.recorded, device_type, held.fit, limit):
        return held
    return structure_plan(struct_cls, dataclasses.replace(shape, stream=True), batch, n_factors, options)


def available_memory(device: torch.device | str) -> int:
    """Bytes a new allocation can use on ``device``: CUDA free memory plus the blocks the caching
    allocator holds unused; else ``MemAvailable`` of ``/proc/meminfo`` (Linux)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise RuntimeError("available memory unknown on this system (no /proc/meminfo MemAvailable); pass "
                       "memory_budget=None to skip the memory plan")


def check_budget(memory_budget) -> float | None:
    """``memory_budget``: ``None`` (no check) or a fraction in (0, 1] of the available memory."""
    if memory_budget is None:
        return None
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float)) or not 0 < memory_budget <= 1:
        raise ValueError(f"memory_budget must be None (no memory check) or a fraction in (0, 1] of the "
                         f"available memory; got {memory_budget!r}")
    return float(memory_budget)


@dataclass
class FitPlan:
    """One row of a plan table: a (subset, structure) with its memory plan (``None``: not declared)."""

    subset: str
    structure: str
    n_params: int
    memory: MemoryPlan | None
    seconds: float | None = None  # predicted fit time (``probe_fit_time``), where probed

    @property
    def label(self) -> str:
        return f"{self.structure}/{self.subset}"


def alternatives(model: nn.Module, probe: dict, batch: int, n_factors: int, curvature: str,
                 last_layer_name: str | None = None, dtype=None, device_type: str | None = None,
                 limit: float | None = None) -> list[FitPlan]:
    """Plans of every registered structure that supports ``curvature``, for every subset (default
    options), their streaming decided as ``fit_plan`` does on ``device_type`` with ``limit``."""
    rows = []
    for subset in SUBSETS:
        try:
            shape = shape_of(model, probe, subset, last_layer_name, dtype)
        except ValueError:  # e.g. no nn.Linear for last_layer
            continue
        for name, cls in STRUCTURES.items():
            if curvature in cls.curvature_types:
                rows.append(FitPlan(subset, name, shape.n_params,
                                    fit_plan(cls, shape, batch, n_factors, None, device_type, limit)))
    return rows


def laplace_plan(la, X, batch: int | None = None, device: torch.device | None = None,
                 limit: float | None = None, probe: dict | None = None) -> tuple[MemoryPlan | None, dict]:
    """The plan of ``la`` (a ``Laplace``) for fit batches of ``batch`` inputs (default: ``X``'s) on
    ``device`` (default: ``la``'s) with ``limit`` bytes (``fit_plan``; ``None``: the constant
    streaming rule), and the model probe (``probe_model`` on the batch ``X``, unless given)."""
    probe = probe or probe_model(la.model, X)
    batch = batch or _batch_size(X)
    shape = shape_of(la.model, probe, la.subset_of_weights, _last_layer_name(la), la.dtype)
    K = n_output_factors(la.likelihood, la.curvature, probe["n_outputs"], la.n_mc_samples)
    cls = type(la.structure)
    options = {k: getattr(la.structure, k) for k in cls.options if hasattr(la.structure, k)}
    plan = fit_plan(cls, shape, batch, K, options, torch.device(device or la.device).type, limit)
    return plan, probe


def _batch_size(X) -> int:
    if isinstance(X, torch.Tensor):
        return X.shape[0]
    return next(v.shape[0] for v in X.values() if isinstance(v, torch.Tensor))


def _last_layer_name(la) -> str | None:
    if la.subset_of_weights != "last_layer":
        return None
    module = la.entries[0].module
    return next(n for n, m in la.model.named_modules() if m is module)


def check_fit(la, X, memory_budget: float | None, device: torch.device | None = None) -> MemoryPlan | None:
    """``MemoryPlanError`` before any allocation when ``la``'s planned fit peak (batches like ``X``,
    streaming as ``fit_plan`` decides) exceeds ``memory_budget`` times the available memory of
    ``device`` (default: ``la``'s); returns the plan (``None``: no check)."""
    if memory_budget is None:
        return None
    device = torch.device(device or la.device)
    avail = available_memory(device)
    limit = memory_budget * avail
    plan, probe = laplace_plan(la, X, device=device, limit=limit)
    if plan is None or plan.fit <= limit:
        return plan
    K = n_output_factors(la.likelihood, la.curvature, probe["n_outputs"], la.n_mc_samples)
    rows = alternatives(la.model, probe, _batch_size(X), K, la.curvature, _last_layer_name(la), la.dtype,
                        device.type, limit)
    fits = sorted((r for r in rows if r.memory is not None and r.memory.fit <= limit), key=lambda r: r.memory.fit)
    biggest = max(plan.parts, key=plan.parts.get) if plan.parts else None
    alt = ", ".join(f"hessian_structure={r.structure!r} subset_of_weights={r.subset!r} ({human(r.memory.fit)})"
                    for r in fits) or "none (reduce the fit batch or the model)"
    raise MemoryPlanError(
        f"hessian_structure={la.hessian_structure!r} with subset_of_weights={la.subset_of_weights!r} "
        f"({la.n_params:,} parameters, curvature={la.curvature!r}, batch {_batch_size(X)}) needs about "
        f"{human(plan.fit)} to fit" + (f" (largest part: {biggest} {human(plan.parts[biggest])})" if biggest else "")
        + f", but memory_budget={memory_budget} of the {human(avail)} available on {device} is "
        f"{human(limit)}. Alternatives that fit: {alt}. memory_budget=None skips this check.")


def factor_streaming(la, X=None, memory_plan: MemoryPlan | None = None) -> bool | None:
    """The capture backend's streaming decision for ``la``'s fit (``Laplace.factor_streaming``): on
    ``BUDGET_DEVICES`` with a ``memory_budget``, ``memory_plan.stream`` (``check_fit``'s plan of the
    first batch) or else ``fit_plan``'s on the first batch ``X``; ``None`` (``stream_factors``'
    constant rule, per batch) elsewhere, where the structure declares no plan and where ``X`` is not
    a float tensor (the backend streams only those)."""
    if la.device.type not in BUDGET_DEVICES or la.memory_budget is None:
        return None
    if memory_plan is None and not (isinstance(X, torch.Tensor) and X.is_floating_point()):
        return None
    if memory_plan is None:
        memory_plan, _ = laplace_plan(la, X, limit=la.memory_budget * available_memory(la.device))
    return None if memory_plan is None else memory_plan.stream


AUTO_FIT_BATCH_CAP = 4096  # the largest fit batch ``auto_fit_batch`` tries


def auto_fit_batch(la, X, base: int, cap: int = AUTO_FIT_BATCH_CAP, memory_budget: float = DEFAULT_MEMORY_BUDGET,
                   device: torch.device | None = None) -> tuple[int, str]:
    """``(batch, reason)``: the fit batch for ``la`` on ``device`` (default: ``la``'s), ``X`` a batch
    of its inputs (not read off ``BUDGET_DEVICES``). On ``BUDGET_DEVICES``: the largest ``base * 2^k <= max(base, cap)`` whose fit,
    planned holding every output factor's gradients, fits ``memory_budget`` times the available
    memory (a batch that would only fit streamed is not taken: streaming costs time there); ``base``
    where none does (the fit then streams or ``check_fit`` refuses it), on other devices (the CPU: a
    larger batch measured no faster), for ``curvature='mc_fisher'`` (labels are drawn per batch: the
    batch changes the fit) and where the structure declares no plan. The other curvature types sum
    over the data: a fit at any batch equals one at ``base`` up to float round-off."""
    device = torch.device(device or la.device)
    if device.type not in BUDGET_DEVICES:
        return base, f"{device.type}: the eval batch, a larger fit batch measured no faster there"
    if la.curvature == "mc_fisher":
        return base, "curvature='mc_fisher' draws its labels per batch: the batch would change the fit"
    avail = available_memory(device)
    limit, probe, batch = memory_budget * avail, probe_model(la.model, X), base
    while batch * 2 <= cap:
        memory, _ = laplace_plan(la, X, batch * 2, device, limit, probe)
        if memory is None:
            return base, f"hessian_structure={la.hessian_structure!r} declares no memory plan"
        if memory.stream or memory.fit > limit:
            break
        batch *= 2
    return batch, (f"the largest {base} x 2^k <= {cap} whose fit holds its output factors within "
                   f"memory_budget={memory_budget} of the {human(avail)} available on {device}")


def predict_chunk(la, plan: MemoryPlan, chunk_size: int | None, n_inputs: int, memory_budget: float) -> int:
    """The predictive's inputs per chunk: ``chunk_size`` (``None``: all ``n_inputs``), lowered to what
    ``memory_budget`` of the available memory holds beside the fixed part; ``MemoryPlanError`` when
    not even one input fits."""
    want = min(chunk_size or n_inputs, n_inputs)
    limit = memory_budget * available_memory(la.device) - plan.predict_fixed
    fit = int(limit // plan.predict_per_input) if limit > 0 else 0
    if fit < 1:
        raise MemoryPlanError(
            f"the glm predictive of hessian_structure={la.hessian_structure!r} (subset_of_weights="
            f"{la.subset_of_weights!r}, {la.n_outputs} outputs) needs about {human(plan.predict_fixed)} plus "
            f"{human(plan.predict_per_input)} per test input, more than memory_budget={memory_budget} of "
            f"the available memory ({human(memory_budget * available_memory(la.device))}); use pred_type='nn' "
            "or a structure with a smaller predictive, or memory_budget=None to skip this check")
    return max(1, min(want, fit))


def planned_chunk(la, x, chunk_size: int | None) -> int | None:
    """The glm predictive's chunk for ``x`` (``predict_chunk`` on ``la``'s plan, cached per input
    shape); ``chunk_size`` unchanged where ``la`` has no ``memory_budget`` (or it is ``None``), ``x`` is
    not a tensor, or the structure declares no plan."""
    budget = getattr(la, "memory_budget", None)
    if budget is None or not isinstance(x, torch.Tensor) or x.shape[0] == 0:
        return chunk_size
    key = (tuple(x.shape[1:]), x.dtype, la.n_outputs)
    cached = getattr(la, "_predict_plan", None)
    if cached is None or cached[0] != key:
        cached = (key, laplace_plan(la, x[:1], batch=1)[0])  # one input: x may be the whole test set
        la._predict_plan = cached
    if cached[1] is None:
        return chunk_size
    return predict_chunk(la, cached[1], chunk_size, x.shape[0], budget)


# ---- time ------------------------------------------------------------------------------------------
def probe_fit_time(make_laplace, X, y, n_batches: int, repeats: int = 2) -> float:
    """Predicted fit seconds: ``make_laplace()`` (a fresh ``Laplace``) fits the batch ``(X, y)``
    ``repeats`` times; the last batch's time times ``n_batches``, plus the measured ``fit_end``
    (finalisation), times ``FIT_TIME_OVERHEAD``. Self-fitting structures (lowrank) are timed as a
    whole ``fit`` on the one batch, times ``n_batches``."""
    la = make_laplace()
    if la.structure.self_fitting:
        start = time.perf_counter()
        la.fit([(X, y)])
        return FIT_TIME_OVERHEAD * n_batches * (time.perf_counter() - start)
    la.fit_begin()
    seconds = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        la.fit_batch(X, y)
        seconds = time.perf_counter() - start
    start = time.perf_counter()
    la.fit_end()
    return FIT_TIME_OVERHEAD * (seconds * n_batches + time.perf_counter() - start)
