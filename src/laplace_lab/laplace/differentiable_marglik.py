"""Laplace log marginal likelihood differentiable in the augmentation ranges ``eta``
(Immer, van der Ouderaa et al. 2022): the curvature itself depends on ``eta`` (through the
augmented inputs), so its factors are built with autograd graphs kept (``create_graph=True``).

Scope: ``model`` an ``AugmentedModel`` whose ``net`` has parameters only in ``nn.Linear`` and
plain ``nn.Conv2d`` layers (``modules.is_kfac_module``), all weights; likelihood classification
or regression (unit noise); prior scalar ``[1]`` or layerwise ``[n_tensors]``; prior mean 0.

Curvature (``curvature``: ``ggn`` | ``ef``) of the averaged model ``f(x) = 1/S sum_s g(T_s x)``:
output factors ``V`` ``[K, N, C]`` (``ggn``: ``K = C`` columns of the softmax Hessian's square root;
``ef``: ``K = 1``, the NLL gradient), back-propagated through the mean to every layer output, so
a layer sees output gradients ``g`` ``[K, N S, ...]`` (each carrying the ``1/S``) and inputs ``a``
``[N S, ...]``.

- ``kron`` (KFAC for the invariant model, "reduce" over the augmentation axis): per datum the
  layer inputs are averaged and the output gradients summed over the ``S`` samples,
  ``a_n = 1/S sum_s a_ns``, ``g_n = sum_s g_ns`` (conv layers keep their spatial positions as the
  engine's expand rows), then ``A = sum a a^T / rows``, ``G = sum_k sum g g^T``. This keeps the
  structure of the averaged Jacobian ``1/S sum_s J_s``: for ``S`` identical samples (``eta = 0``) it
  equals the engine's KFAC of the plain network (tested), and it shrinks as the samples decorrelate,
  which is the Occam effect invariance learning rests on. Same normalisation as the authors' code
  (mean over the samples in ``A``, sum in ``G``, ``A`` divided by the data count: see
  experiments/immer2022_invariance_cpu/README.md); for one datum and one linear layer it is the exact
  GGN / EF block of the averaged model (tested against a dense ``torch.func`` float64 reference).
- ``kron_expand``: the engine's convention applied to the ``N S`` augmented rows as if they were
  weight-sharing positions (what ``Laplace.fit`` computes for the same ``AugmentedModel``; tested
  equal; ``fit_laplace`` fits a ``Laplace`` with ``kron`` / ``diag`` instead).
  At ``eta = 0`` its ``G`` is ``1 / S`` of the plain network's, so it under-counts the curvature
  and barely rewards invariance: kept for comparison, not for learning ``eta``.
- ``diag``: the exact diagonal of the averaged model's GGN / EF: per-datum gradients summed over
  the ``S`` samples, then squared (tested against a dense ``torch.func`` float64 reference).

log det uses only eigenvalues (``eigvalsh``), whose backward is ``Q diag(dL/dlam) Q^T`` and is well
defined for repeated eigenvalues. Formula (the engine's): ``log p(D|theta) - 1/2 (log det P -
log det P0 + theta^T P0 theta)`` with ``P = c H + P0``, ``c = 1 / T``.

Full data sets: ``fit_factors`` accumulates the factors over a loader without graphs;
``log_marglik`` with ``full=...`` replaces one batch's contribution by a differentiable one
scaled by ``n_full / n_batch`` (value = the full-data marglik, gradient = an unbiased one-batch
estimate of the full-data gradient), the "partial fit" schedule of the authors' code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from laplace_lab.laplace.likelihoods import get_likelihood
from laplace_lab.laplace.modules import is_kfac_module, rows_in, rows_out

STRUCTURES = ("kron", "kron_expand", "diag")  # this module's factor forms (its own, not the engine's classes)
CURVATURE_TYPES = ("ggn", "ef")  # the output factors this module back-propagates
LIKELIHOODS = ("classification", "regression")


def laplace_structures() -> tuple[str, ...]:
    """The registered engine structures whose curvature ``fit_laplace`` can load: those that implement
    ``Structure.load_layer_curvature`` and share their name with a factor form of this module."""
    from laplace_lab.laplace.structures import STRUCTURES as REGISTERED
    from laplace_lab.laplace.structures.base import Structure

    return tuple(name for name, cls in REGISTERED.items()
                 if name in STRUCTURES and cls.load_layer_curvature is not Structure.load_layer_curvature)


@dataclass
class Factors:
    """Curvature sums of one or more batches. kron: per layer ``{"A": [Di, Di] (un-normalised),
    "G": [Do, Do], "rows": int}``; diag: per parameter tensor ``[numel]``. ``loss``: summed NLL."""
    layers: list
    loss: torch.Tensor
    n: int

    def combine(self, other: Factors) -> Factors:
        """Entry-wise sum (two disjoint sets of batches)."""
        def add(a, b):
            return {k: a[k] + b[k] for k in a} if isinstance(a, dict) else a + b
        return Factors([add(a, b) for a, b in zip(self.layers, other.layers)], self.loss + other.loss,
                       self.n + other.n)


def _check(model, structure: str, curvature: str, likelihood: str) -> list[nn.Module]:
    for opt, v, allowed in (("structure", structure, STRUCTURES), ("curvature", curvature, CURVATURE_TYPES),
                            ("likelihood", likelihood, LIKELIHOODS)):
        if v not in allowed:
            raise ValueError(f"differentiable marglik: {opt} must be one of {allowed}; got {v!r}")
    if not (hasattr(model, "net") and hasattr(model, "augmentation")):
        raise ValueError("differentiable marglik needs an AugmentedModel (net + augmentation)")
    layers = [m for m in model.net.modules() if any(True for _ in m.parameters(recurse=False))]
    bad = [type(m).__name__ for m in layers if not is_kfac_module(m)]
    if bad:
        raise ValueError(f"differentiable marglik supports parameters in nn.Linear / nn.Conv2d only; found {bad}")
    return layers


def _output_factors(lik, curvature: str, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[K, N, C]`` square-root factors of the output-space curvature, differentiable in ``f``."""
    if curvature == "ef":
        if lik.name == "classification":
            return (f.softmax(-1) - F.one_hot(y, f.shape[1]).to(f.dtype))[None]
        return (f - y)[None]
    return lik.hessian_sqrt(f)


def batch_factors(model: nn.Module, X: torch.Tensor, y: torch.Tensor, structure: str = "kron",
                  curvature: str = "ggn", likelihood: str = "classification", eta: torch.Tensor | None = None,
                  eps: torch.Tensor | None = None, create_graph: bool = True) -> Factors:
    """Curvature sums and NLL of one batch ``X`` ``[N, C, H, W]``, ``y`` ``[N]`` (or ``[N, C]``);
    with ``create_graph`` everything is differentiable in ``eta`` ``[6]``."""
    layers = _check(model, structure, curvature, likelihood)
    lik = get_likelihood(likelihood)
    inputs, outputs = {}, {}

    def hook(m, args, out):
        inputs.setdefault(m, []).append(args[0])
        outputs.setdefault(m, []).append(out)

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.enable_grad():
            out = model(X, eps=eps, eta=eta)
    finally:
        for h in handles:
            h.remove()
    if any(len(v) != 1 for v in inputs.values()) or len(inputs) != len(layers):
        raise ValueError("differentiable marglik needs every parameterised layer called exactly once")
    f, yy = lik.prepare(out, y)
    V = _output_factors(lik, curvature, f, yy)
    outs = [outputs[m][0] for m in layers]
    per_k = [torch.autograd.grad(f, outs, grad_outputs=V[k], create_graph=create_graph, retain_graph=True)
             for k in range(V.shape[0])]
    grads = [torch.stack([pk[i] for pk in per_k]) for i in range(len(layers))]  # [K, N S, ...] per layer
    N, S = X.shape[0], model.augmentation.n_samples
    parts = []
    for m, g in zip(layers, grads):
        a = rows_in(m, inputs[m][0])  # [N S, P, Din]
        go = rows_out(m, g)  # [K, N S, P, Dout]
        if structure in ("kron", "kron_expand"):
            if structure == "kron":  # reduce over the S samples of each datum
                a = a.reshape(N, S, *a.shape[1:]).mean(1)
                go = go.reshape(go.shape[0], N, S, *go.shape[2:]).sum(2)
            a2 = a.reshape(-1, a.shape[-1])
            g2 = go.reshape(-1, go.shape[-1])
            parts.append({"A": a2.T @ a2, "G": g2.T @ g2, "rows": a2.shape[0]})
        else:  # per-datum gradients (sum over the S samples and positions), squared
            K = go.shape[0]
            gw = torch.einsum("kmpo,mpi->kmoi", go, a).reshape(K, N, S, *m.weight.shape).sum(2)
            parts.append(gw.square().sum((0, 1)).reshape(-1))
            if m.bias is not None:
                gb = go.sum(2).reshape(K, N, S, -1).sum(2)
                parts.append(gb.square().sum((0, 1)))
    loss = lik.nll(f, yy)
    if not create_graph:
        parts = [({k: (v.detach() if torch.is_tensor(v) else v) for k, v in p.items()} if isinstance(p, dict)
                  else p.detach()) for p in parts]
        loss = loss.detach()
    return Factors(parts, loss, N)


def fit_factors(model: nn.Module, loader, structure: str = "kron", curvature: str = "ggn",
                likelihood: str = "classification", eta: torch.Tensor | None = None) -> Factors:
    """Graph-free sums over every batch of ``loader`` (yields ``(X, y)``)."""
    total = None
    for X, y in loader:
        fb = batch_factors(model, X, y, structure, curvature, likelihood, eta=eta, create_graph=False)
        total = fb if total is None else total.combine(fb)
    if total is None:
        raise ValueError("fit_factors: the loader is empty")
    return total


def fit_laplace(la, model: nn.Module, loader, likelihood: str = "classification") -> Factors:
    """Fit the engine's ``Laplace`` ``la`` (built on the ``AugmentedModel`` ``model``; ``kron`` or
    ``diag``, all weights, curvature ``ggn`` | ``ef``) with this module's curvature of the averaged
    model (``kron``: the reduce KFAC; ``diag``: the exact diagonal) instead of its own KFAC, which
    treats the ``N S`` augmented rows as weight-sharing positions (``kron_expand``). Afterwards
    ``la.log_marginal_likelihood`` equals ``log_marglik_from_factors`` of the returned graph-free
    full-data ``Factors`` (tested), so a prior step on ``la`` and an eta step on the factors optimise
    the same marglik, as the authors' code does (one ``Laplace`` for both)."""
    structure, curvature = la.hessian_structure, la.curvature
    if structure not in laplace_structures() or la.subset_of_weights != "all":
        raise ValueError(f"fit_laplace needs curvature.hessian_structure in {list(laplace_structures())} and "
                         f"curvature.subset_of_weights='all'; got ({structure!r}, {la.subset_of_weights!r})")
    layers = _check(model, structure, curvature, likelihood)
    if [e.module for e in la.entries] != layers or la.model is not model:
        raise ValueError("fit_laplace: la must be a Laplace of the same AugmentedModel over all its layers")
    la.fit_begin()  # resets the accumulators, eval mode, stores the mean
    fac = fit_factors(model, loader, structure, curvature, likelihood)
    la.structure.load_layer_curvature(fac.layers)
    la.loss, la.n_data = fac.loss.detach(), fac.n
    la.n_outputs = layers[-1].weight.shape[0]
    la.fit_end()  # KFAC eigendecompositions; restores the train/eval mode
    return fac


def _eigvals(M: torch.Tensor) -> torch.Tensor:
    """Eigenvalues computed in float64 (float32 LAPACK can fail on rank-deficient factors)."""
    return torch.linalg.eigvalsh(M.double()).clamp_min(0).to(M.dtype)


def log_marglik_from_factors(model: nn.Module, fac: Factors, prior_precision: torch.Tensor,
                             structure: str = "kron", temperature: float = 1.0,
                             likelihood: str = "classification") -> torch.Tensor:
    """0-dim Laplace log marglik from curvature sums; differentiable in the factors and the prior
    (``[1]`` scalar or ``[n_tensors]`` layerwise, net parameters in ``model.net.parameters()`` order)."""
    layers = _check(model, structure, "ggn", likelihood)
    params = [p for m in layers for p in m.parameters(recurse=False)]
    prior = prior_precision.reshape(-1)
    if prior.numel() not in (1, len(params)):
        raise ValueError(f"prior_precision must have 1 (scalar) or {len(params)} (layerwise) entries; "
                         f"got {prior.numel()}")
    deltas = prior.expand(len(params)) if prior.numel() == 1 else prior
    c = 1.0 / temperature
    logdet, i = 0.0, 0
    kron = structure in ("kron", "kron_expand")
    for m, part in zip(layers, fac.layers if kron else [None] * len(layers)):
        names = [n for n, _ in m.named_parameters(recurse=False)]
        if kron:
            lamG, lamA = _eigvals(part["G"]), _eigvals(part["A"] / part["rows"])
            for n in names:
                lam = torch.outer(lamG, lamA).reshape(-1) if n == "weight" else lamG
                logdet = logdet + (c * lam + deltas[i]).log().sum()
                i += 1
        else:
            for _ in names:
                logdet = logdet + (c * fac.layers[i] + deltas[i]).log().sum()
                i += 1
    sizes = torch.tensor([p.numel() for p in params], dtype=prior.dtype, device=prior.device)
    log_det_prior = (sizes * deltas.log()).sum()
    scatter = sum(d * p.detach().square().sum() for d, p in zip(deltas, params))
    log_lik = -c * fac.loss
    if likelihood == "regression":
        C = layers[-1].weight.shape[0]
        log_lik = log_lik - fac.n * C * math.log(math.sqrt(2 * math.pi))
    return log_lik - 0.5 * (logdet - log_det_prior + scatter)


def log_marglik(model: nn.Module, X: torch.Tensor, y: torch.Tensor, eta: torch.Tensor,
                prior_precision: torch.Tensor, structure: str = "kron", curvature: str = "ggn",
                likelihood: str = "classification", temperature: float = 1.0, eps: torch.Tensor | None = None,
                full: Factors | None = None) -> torch.Tensor:
    """0-dim log marglik differentiable in ``eta`` ``[6]`` and ``prior_precision``.

    Without ``full``: the marglik of the batch ``(X, y)`` alone. With ``full`` (``fit_factors`` of
    the whole training set): value = the full-data marglik, gradient in ``eta`` = the batch's
    gradient scaled by ``full.n / N``."""
    fb = batch_factors(model, X, y, structure, curvature, likelihood, eta=eta, eps=eps, create_graph=True)
    if full is not None:
        scale = full.n / fb.n

        def swap(total, part):  # total + scale * (part - part.detach()): value total, gradient of part
            return total + scale * (part - part.detach())

        layers = [({"A": swap(t["A"], b["A"]), "G": swap(t["G"], b["G"]), "rows": t["rows"]}
                   if isinstance(t, dict) else swap(t, b)) for t, b in zip(full.layers, fb.layers)]
        fb = Factors(layers, swap(full.loss, fb.loss), full.n)
    return log_marglik_from_factors(model, fb, prior_precision, structure, temperature, likelihood)
