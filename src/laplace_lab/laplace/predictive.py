"""Predictive distributions of a fitted ``Laplace``: ``la(x, pred_type, link_approx, ...)``.

Hand-written (the link approximations are a few lines each; the functional variance is in
``functional_variance``, which never forms per-input Jacobians over all weights).

``pred_type``:

- ``"glm"``: the linearised network, ``f(x) ~ N(f_MAP(x), J Sigma J^T)`` (Immer et al. 2021).
  After ``linear_mode.fit_linear_mode`` (``la.linear_offset`` set) the mean is the linear model's
  at its mode, ``f(x; theta_hat) + J (theta* - theta_hat)``; "nn" samples around ``la.mean`` =
  theta*, "map" stays the network at its weights.
  Classification links: ``"probit"`` (default; ``softmax(f / sqrt(1 + pi/8 diag(var)))``),
  ``"mc"`` (``n_samples`` draws of ``f``, softmax, average), ``"bridge"`` (Laplace bridge to a
  Dirichlet, returning its normalised mean; laplace-torch 0.3's formula including its zero-mean
  correction) and ``"bridge_norm"`` (plus its variance correction).
- ``"nn"``: ``n_samples`` weight draws from the posterior, the network run at each
  (``torch.func.functional_call``: the model's own weights are never modified), averaged.
  For ``last_layer`` the features are computed once and only the last layer is re-applied.
- ``"map"``: the plug-in prediction at the MAP weights.

Returns, for ``x`` ``[B, ...]`` (``C`` = network outputs):

- classification: probabilities ``[B, C]``.
- regression: ``(mean [B, C], var [B, C])`` with ``var = functional variance + sigma^2``;
  ``joint=True``: ``(mean, cov [B, C, C])``.
- heteroscedastic regression (network outputs ``[eta1 (D) | raw (D)]``): ``(mean [B, D],
  var [B, D])`` in the original units. glm (closed form): the mean ``-eta1 / (2 eta2)`` is
  linearised in the network outputs (delta method: epistemic = ``a^T Cov[f] a`` with
  ``a = d mean / d (eta1, raw)``) and the aleatoric part is ``-1 / (2 eta2)`` at the MAP
  (``het_approx="mean"``, the default); ``het_approx="natural"`` linearises eta1 alone and keeps
  eta2 at the MAP (the authors' ``het_approx='natural'``, the predictive Immer et al. 2023 report):
  epistemic = ``s^2 Var[eta1]`` with ``s = -1 / (2 eta2)``, the same mean and aleatoric part;
  ``link_approx="mc"`` and ``"nn"`` use samples of the natural parameters and the law of total
  variance (aleatoric = E[var], epistemic = Var[mean]).
- ``return_parts=True`` (regression likelihoods): ``RegressionPredictive(mean, var, aleatoric,
  epistemic)`` (a named tuple; with ``joint=True`` all three are ``[B, D, D]``).

For regression likelihoods ``link_approx`` may be ``None``, ``"probit"`` (the configs' default;
both mean the closed form) or ``"mc"``; the bridge links raise.

Gradients: the glm predictive (every link) is differentiable w.r.t. ``x`` when ``x.requires_grad``
and grad mode is on (the module inputs and output-gradients keep their graph; memory then grows
with the number of inputs per call); otherwise a cheaper detached path is used. It is always
differentiable w.r.t. the prior precision / sigma. ``nn`` and ``map`` are differentiable through
the network as usual.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch.func import functional_call

from laplace_lab.laplace.capture import Capture
from laplace_lab.laplace.functional_variance import (
    DEFAULT_BUDGET,
    functional_variance,
    posterior_view,
)
from laplace_lab.laplace.likelihoods import HeteroscedasticRegression
from laplace_lab.laplace.linear_mode import linear_shift
from laplace_lab.laplace.options import HetApprox, LinkApprox, PredType
from laplace_lab.laplace.plan import planned_chunk

PRED_TYPES = PredType.values()
LINKS = LinkApprox.values()
HET_APPROXES = HetApprox.values()
REGRESSION_LINKS = ("probit", "mc")  # probit = the closed form for Gaussian likelihoods


class RegressionPredictive(NamedTuple):
    """Regression predictive with its parts; ``var = aleatoric + epistemic``."""

    mean: torch.Tensor
    var: torch.Tensor
    aleatoric: torch.Tensor
    epistemic: torch.Tensor


def check_nn_link(pred_type: str, link_approx: str | None, key=lambda name: name) -> None:
    """``pred_type='nn'`` samples the network, so ``link_approx`` must be 'mc' or None (laplace-torch's
    rule); ``key`` maps 'pred_type' / 'link_approx' to the caller's option names in the message."""
    if pred_type == "nn" and link_approx not in (None, "mc"):
        raise ValueError(f"{key('pred_type')}='nn' samples the network: {key('link_approx')} must be 'mc' "
                         f"(laplace-torch's rule; the default is 'probit'); got {key('link_approx')}={link_approx!r}")


def _check_het_approx(la, pred_type, link, het_approx) -> None:
    """``het_approx`` picks the heteroscedastic closed form; anywhere else only its default is allowed."""
    if het_approx not in HET_APPROXES:
        raise ValueError(f"het_approx must be one of {HET_APPROXES}; got {het_approx!r}")
    if het_approx == HetApprox.MEAN:
        return
    if la.likelihood != "heteroscedastic_regression":
        raise ValueError(f"het_approx={het_approx!r} needs likelihood='heteroscedastic_regression'; "
                         f"got likelihood={la.likelihood!r}")
    if pred_type != "glm" or link == "mc":
        raise ValueError(f"het_approx={het_approx!r} is a closed form of the glm predictive: it needs "
                         f"pred_type='glm' and link_approx 'probit' or None; got pred_type={pred_type!r}, "
                         f"link_approx={link!r}")


def _check(la, pred_type, link_approx, n_samples, joint, chunk_size, return_parts) -> str | None:
    if pred_type not in PRED_TYPES:
        raise ValueError(f"pred_type must be one of {PRED_TYPES}; got {pred_type!r}")
    if link_approx is not None and link_approx not in LINKS:
        raise ValueError(f"link_approx must be one of {LINKS} (or None); got {link_approx!r}")
    if not (isinstance(n_samples, int) and n_samples >= 1):
        raise ValueError(f"n_samples must be a positive int; got {n_samples!r}")
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive int or None; got {chunk_size!r}")
    classification = la.likelihood == "classification"
    if joint and (classification or pred_type == "nn"):
        raise ValueError(
            "joint=True (joint covariance across outputs) needs a regression likelihood and "
            f"pred_type in ('glm', 'map'); got likelihood={la.likelihood!r}, pred_type={pred_type!r}"
        )
    if return_parts and classification:
        raise ValueError("return_parts=True needs likelihood in ('regression', 'heteroscedastic_regression')")
    if pred_type == "map":
        return None
    if classification:
        if pred_type == "nn":
            check_nn_link(pred_type, link_approx)
            return "mc"
        return link_approx or "probit"
    if link_approx is not None and link_approx not in REGRESSION_LINKS:
        raise ValueError(
            f"link_approx={link_approx!r} makes no sense for likelihood={la.likelihood!r}; "
            f"allowed: {REGRESSION_LINKS} (probit = the closed form) or None"
        )
    return link_approx if pred_type == "glm" else "mc"


def _chunks(x, chunk_size):
    """Input chunks along the batch dim; a non-tensor input (e.g. a dict batch) is one chunk."""
    return torch.split(x, chunk_size) if chunk_size and isinstance(x, torch.Tensor) else (x,)


def _requires_grad(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad


def predict(la, x: torch.Tensor, pred_type: str = "glm", link_approx: str | None = None,
            n_samples: int = 100, joint: bool = False, chunk_size: int | None = 256,
            return_parts: bool = False, generator: torch.Generator | None = None,
            budget: int = DEFAULT_BUDGET, het_approx: str = "mean"):
    """``la(x, ...)``: see the module docstring. ``chunk_size``: inputs per forward/backward
    (memory bound; the glm predictive lowers it to what ``la.memory_budget`` holds, ``plan.planned_chunk``); ``budget``: elements per per-layer Jacobian block; ``generator``: for the
    ``mc`` / ``nn`` draws (default ``la.generator``); ``het_approx``: the heteroscedastic glm
    closed form, "mean" or "natural"."""
    la.check_fitted()
    link = _check(la, pred_type, link_approx, n_samples, joint, chunk_size, return_parts)
    _check_het_approx(la, pred_type, link, het_approx)
    gen = generator if generator is not None else la.generator
    x = x.to(la.device) if isinstance(x, torch.Tensor) else x
    was_training = la.model.training
    la.model.eval()
    track = torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad
    try:
        if pred_type == "nn":
            with torch.set_grad_enabled(track):
                out = _from_samples(la, nn_samples(la, x, n_samples, gen, chunk_size), joint)
        else:
            if pred_type == "glm":
                chunk_size = planned_chunk(la, x, chunk_size)
            chunks = _chunks(x, chunk_size)
            view = posterior_view(la) if pred_type == "glm" else None
            outs = [_predict_chunk(la, xc, pred_type, link, n_samples, joint, gen, view, budget, het_approx)
                    for xc in chunks]
            out = tuple(torch.cat(parts) for parts in zip(*outs)) if isinstance(outs[0], tuple) else torch.cat(outs)
    finally:
        la.model.train(was_training)
    if la.likelihood == "classification":
        return out
    return RegressionPredictive(*out) if return_parts else (out[0], out[1])


# ------------------------------------------------------------------------------------------- glm
def glm_moments(la, x: torch.Tensor, diag: bool = False, chunk_size: int | None = 256,
                budget: int = DEFAULT_BUDGET) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent Gaussian of the linearised network: ``(f_mu [B, C], f_var [B, C, C])``
    (``[B, C]`` variances if ``diag``). Differentiable w.r.t. ``x`` when ``x.requires_grad``."""
    la.check_fitted()
    view = posterior_view(la)
    was_training = la.model.training
    la.model.eval()
    try:
        outs = [_moments(la, xc, diag, view, budget) for xc in _chunks(x, chunk_size)]
    finally:
        la.model.train(was_training)
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def _moments(la, x, diag, view, budget):
    differentiable = torch.is_grad_enabled() and _requires_grad(x)
    f, fvar = functional_variance(la, x, diag=diag, differentiable=differentiable, view=view, budget=budget)
    offset = getattr(la, "linear_offset", None)
    if offset is not None:  # evidence at the linear mode: mean f(x; theta_hat) + J (theta* - theta_hat)
        with torch.set_grad_enabled(differentiable):
            f = f + linear_shift(la, x, offset).to(f.dtype)
    return f, fvar


def _predict_chunk(la, x, pred_type, link, n_samples, joint, gen, view, budget, het_approx="mean"):
    if pred_type == "map":
        with torch.set_grad_enabled(torch.is_grad_enabled() and _requires_grad(x)):
            out = la.model(x)
            return _map(la, out.reshape(out.shape[0], -1), joint)
    lik = la.likelihood
    diag = (lik == "classification" and link == "probit") or (lik == "regression" and link != "mc" and not joint)
    f, fvar = _moments(la, x, diag, view, budget)
    if lik == "classification":
        if link == "probit":
            return probit(f, fvar)
        if link == "mc":
            return torch.softmax(mvn_samples(f, fvar, n_samples, gen), -1).mean(0)
        return bridge(f, fvar, normalise_variance=link == "bridge_norm")
    if link == "mc":
        return _from_samples(la, mvn_samples(f, fvar, n_samples, gen), joint)
    if lik == "regression":
        s2 = la.sigma_noise.square().to(f.dtype)
        if joint:
            noise = s2 * torch.eye(f.shape[1], dtype=f.dtype, device=f.device).expand_as(fvar)
            return f, fvar + noise, noise, fvar
        return f, fvar + s2, s2.expand_as(fvar), fvar
    return _hetero_linearised(f, fvar, joint, het_approx)


def probit(f: torch.Tensor, fvar: torch.Tensor) -> torch.Tensor:
    """Probit approximation: ``f`` ``[B, C]``, ``fvar`` ``[B, C]`` or ``[B, C, C]``."""
    var = fvar if fvar.ndim == 2 else fvar.diagonal(dim1=1, dim2=2)
    return torch.softmax(f * torch.rsqrt(1.0 + math.pi / 8 * var), -1)


def bridge(f: torch.Tensor, fvar: torch.Tensor, normalise_variance: bool = False) -> torch.Tensor:
    """Laplace bridge (Hobbhahn et al. 2022): ``N(f, fvar)`` ``[B, C], [B, C, C]`` -> Dirichlet
    ``alpha``; returns its mean ``alpha / sum alpha``. As laplace-torch 0.3: the Gaussian is first
    conditioned on ``sum f = 0``; ``normalise_variance`` adds its "bridge_norm" variance scaling."""
    K = f.shape[-1]
    row = fvar.sum(-1)  # [B, C]
    tot = fvar.sum((1, 2))[:, None]  # [B, 1]
    mu = f - row * f.sum(-1, keepdim=True) / tot
    var = fvar.diagonal(dim1=1, dim2=2) - row * fvar.sum(-2) / tot
    if normalise_variance:
        vmean = var.mean(-1, keepdim=True) / math.sqrt(K / 2)
        mu = mu / vmean.sqrt()
        var = var / vmean
    alpha = (1 - 2 / K + mu.exp() / K**2 * torch.exp(-mu).sum(-1, keepdim=True)) / var
    return torch.nan_to_num(alpha / alpha.sum(-1, keepdim=True), nan=1.0)


def mvn_samples(f: torch.Tensor, fvar: torch.Tensor, n: int, generator=None) -> torch.Tensor:
    """``[n, B, C]`` draws from ``N(f, fvar)`` (Cholesky; eigen-decomposition where it fails)."""
    L, info = torch.linalg.cholesky_ex(fvar)
    if bool((info != 0).any()):
        lam, Q = torch.linalg.eigh(fvar)
        L = Q * lam.clamp_min(0).sqrt()[:, None, :]
    eps = torch.randn(n, *f.shape, generator=generator, device=f.device, dtype=f.dtype)
    return f + torch.einsum("bij,sbj->sbi", L, eps)


def _hetero_linearised(f, fvar, joint, het_approx="mean"):
    """Closed-form heteroscedastic predictive from the output moments ``f [B, 2D]``, ``fvar
    [B, 2D, 2D]``: "mean" linearises the mean in (eta1, raw), "natural" in eta1 alone (eta2 at the
    MAP), as the heteroscedastic-nn authors' ``het_approx='natural'``."""
    D = f.shape[1] // 2
    eta1, eta2, raw = HeteroscedasticRegression.natural(f)
    mean, alea = -eta1 / (2 * eta2), -1 / (2 * eta2)
    d_eta1 = alea  # d mean / d eta1 = -1 / (2 eta2)
    d_raw = eta1 / (2 * eta2.square()) * -torch.sigmoid(raw)  # d mean / d eta2 * d eta2 / d raw
    if het_approx == HetApprox.NATURAL:
        d_raw = torch.zeros_like(d_raw)
    A = torch.cat([torch.diag_embed(d_eta1), torch.diag_embed(d_raw)], -1)  # [B, D, 2D]
    if joint:
        epi = A @ fvar @ A.transpose(1, 2)
        aleac = torch.diag_embed(alea)
        return mean, epi + aleac, aleac, epi
    v11, v22 = fvar[:, :D, :D].diagonal(dim1=1, dim2=2), fvar[:, D:, D:].diagonal(dim1=1, dim2=2)
    v12 = fvar[:, :D, D:].diagonal(dim1=1, dim2=2)
    epi = d_eta1.square() * v11 + 2 * d_eta1 * d_raw * v12 + d_raw.square() * v22
    return mean, alea + epi, alea, epi


def _map(la, f, joint):
    if la.likelihood == "classification":
        return torch.softmax(f, -1)
    if la.likelihood == "regression":
        alea = la.sigma_noise.square().to(f.dtype).expand_as(f)
    else:
        f, alea = HeteroscedasticRegression.mean_var(f)
    epi = torch.zeros_like(alea)
    if joint:
        alea, epi = torch.diag_embed(alea), torch.diag_embed(epi)
    return f, alea, alea, epi


def _cov(s: torch.Tensor, joint: bool) -> torch.Tensor:
    """Sample (co)variance over dim 0 of ``[S, B, D]`` (unbiased when ``S > 1``)."""
    S = s.shape[0]
    d = s - s.mean(0)
    denom = max(S - 1, 1)
    return torch.einsum("sbi,sbj->bij", d, d) / denom if joint else d.square().sum(0) / denom


def _from_samples(la, fs: torch.Tensor, joint: bool):
    """Predictive from samples of the network output ``fs`` ``[S, B, C]``."""
    if la.likelihood == "classification":
        return torch.softmax(fs, -1).mean(0)
    if la.likelihood == "regression":
        s2 = la.sigma_noise.square().to(fs.dtype)
        epi = _cov(fs, joint)
        alea = s2 * torch.eye(fs.shape[-1], dtype=fs.dtype, device=fs.device).expand_as(epi) if joint \
            else s2.expand_as(epi)
        return fs.mean(0), epi + alea, alea, epi
    S, B, C = fs.shape
    m, v = HeteroscedasticRegression.mean_var(fs.reshape(S * B, C))
    m, v = m.reshape(S, B, -1), v.reshape(S, B, -1)
    alea = torch.diag_embed(v.mean(0)) if joint else v.mean(0)
    epi = _cov(m, joint)
    return m.mean(0), alea + epi, alea, epi


# -------------------------------------------------------------------------------------------- nn
def nn_samples(la, x: torch.Tensor, n_samples: int, generator=None, chunk_size: int | None = None) -> torch.Tensor:
    """Network outputs ``[S, B, C]`` at ``S = n_samples`` draws ``la.sample(S, generator)`` (one set
    of draws for all chunks of ``x``). The model's parameters are not modified."""
    thetas = la.sample(n_samples, generator)
    chunks = _chunks(x, chunk_size)
    return torch.cat([_nn_chunk(la, xc, thetas) for xc in chunks], 1)


def _nn_chunk(la, x, thetas):
    S = thetas.shape[0]
    B = x.shape[0] if isinstance(x, torch.Tensor) else None  # a dict input: from the output
    if la.subset_of_weights == "last_layer":
        m = la.entries[0].module
        # inputs keep their graph when grad mode is on: the predictive is differentiable w.r.t. x
        with Capture([m], protect_inplace=False, detach_inputs=not torch.is_grad_enabled()) as cap:
            out = la.model(x)
        calls = cap.records[0].calls
        if len(calls) == 1 and calls[0].output is out:  # re-apply only the last layer
            a = calls[0].args[0]
            W, b = _last_layer_params(la, thetas)
            fs = torch.einsum("...i,soi->s...o", a, W)
            if b is not None:
                fs = fs + b.reshape(S, *([1] * (fs.ndim - 2)), -1)
            return fs.reshape(S, out.shape[0], -1)
    names = {id(p): n for n, p in la.model.named_parameters()}
    outs = []
    for theta in thetas:
        chunks = torch.split(theta, la.sizes)
        params = {names[id(p)]: c.view_as(p) for p, c in zip(la.params, chunks)}
        o = functional_call(la.model, params, (x,))
        outs.append(o.reshape(o.shape[0] if B is None else B, -1))
    return torch.stack(outs)


def _last_layer_params(la, thetas):
    e = la.entries[0]
    m, S, i = e.module, thetas.shape[0], 0
    W, b = m.weight.detach().expand(S, *m.weight.shape), None
    for n in e.names:
        p = getattr(m, n)
        chunk = thetas[:, i:i + p.numel()].reshape(S, *p.shape)
        i += p.numel()
        if n == "weight":
            W = chunk
        else:
            b = chunk
    if b is None and m.bias is not None:
        b = m.bias.detach().expand(S, -1)
    return W, b


# ----------------------------------------------------------------------------- validation NLL
def predictive_nll(likelihood: str, out, y: torch.Tensor) -> torch.Tensor:
    """Summed NLL of targets ``y`` under a predictive ``out`` (probabilities ``[B, C]`` or
    ``(mean, var)`` ``[B, D]``)."""
    if likelihood == "classification":
        p = out.gather(-1, y.reshape(-1, 1).long().to(out.device))[:, 0]
        return -p.clamp_min(torch.finfo(p.dtype).tiny).log().sum()
    mean, var = out[0], out[1]
    y = y.reshape(mean.shape).to(mean)
    return 0.5 * ((y - mean).square() / var + torch.log(2 * math.pi * var)).sum()


__all__ = ["PRED_TYPES", "LINKS", "RegressionPredictive", "predict", "glm_moments", "nn_samples", "probit",
           "bridge", "mvn_samples", "predictive_nll"]
