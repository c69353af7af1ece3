"""Learnable affine data augmentation and the invariant (output-averaged) network
(Immer, van der Ouderaa et al. 2022, "Invariance Learning in Deep Neural Networks with
Differentiable Laplace Approximations").

``AffineAugmentation`` draws ``S`` transformations per image: ``eps ~ U(-1, 1)^6`` and the
affine matrix ``exp(sum_i eps_i eta_i G_i)`` (matrix exponential of a Lie-algebra element with
the six generators of ``TRANSFORMS``), applied by ``affine_grid`` / ``grid_sample`` (bilinear by
default, ``align_corners=True``, zero padding). Everything is differentiable in ``eta`` (the
reparameterisation: ``eps`` does not depend on ``eta``). Units: coordinates are normalised to
``[-1, 1]`` across the image, so ``translate_x = 1`` is half the image width; ``rotation`` is in
radians (``pi`` = the full circle, clamped there); ``scale_*`` and ``shear`` are log-scale /
shear amounts.

``eta`` is a buffer, not a parameter: the MAP loss never trains it (training eta on the data
fit alone shrinks it to zero, the reason the paper uses the marglik); the marglik code passes a
differentiable ``eta`` explicitly (``forward(..., eta=...)``) and writes the result back.

``AugmentedModel(net, augmentation)``: ``f(x) = mean_s net(T(x; eta * eps_s))`` ``[N, C]``, the
average of the *logits* over the ``S`` samples, as the authors' code does (method ``avgfunc``:
``model(X).mean(dim=1)`` on the ``[N, S, C]`` outputs, tychovdo/lila ``lila/marglik.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

TRANSFORMS = ("translate_x", "translate_y", "rotation", "scale_x", "scale_y", "shear")


def _generators() -> torch.Tensor:
    """``[6, 3, 3]`` Lie-algebra generators of the 2-d affine group, in ``TRANSFORMS`` order."""
    G = torch.zeros(6, 3, 3)
    G[0, 0, 2] = 1.0  # translate x
    G[1, 1, 2] = 1.0  # translate y
    G[2, 0, 1], G[2, 1, 0] = -1.0, 1.0  # rotation
    G[3, 0, 0] = 1.0  # scale x
    G[4, 1, 1] = 1.0  # scale y
    G[5, 0, 1], G[5, 1, 0] = 1.0, 1.0  # shear
    return G


def eta_vector(init: dict | None) -> torch.Tensor:
    """``[6]`` eta from ``{name: value}`` (missing names 0); unknown names are rejected."""
    init = dict(init or {})
    unknown = sorted(set(init) - set(TRANSFORMS))
    if unknown:
        raise ValueError(f"augmentation.init has unknown transform(s) {unknown}; allowed: {list(TRANSFORMS)}")
    return torch.tensor([float(init.get(n, 0.0)) for n in TRANSFORMS])


class AffineAugmentation(nn.Module):
    """``S`` random affine transformations of each image ``[N, C, H, W]`` -> ``[N S, C, H, W]``
    (sample-major within each image: row ``n S + s``).

    Args:
        n_samples: ``S``.
        init: initial ranges ``{transform name: eta}`` (see ``TRANSFORMS``; missing ones are 0).
        learnable: names whose range the marglik learns (the others stay at ``init``).
        mode: ``grid_sample`` interpolation, ``bilinear`` (the authors' choice) or ``bicubic``
            (continuously differentiable in ``eta``: finite-difference tests).
    """

    def __init__(self, n_samples: int = 31, init: dict | None = None, learnable: Sequence[str] = (),
                 mode: str = "bilinear"):
        super().__init__()
        if mode not in ("bilinear", "bicubic"):
            raise ValueError(f"augmentation.mode must be one of ('bilinear', 'bicubic'); got {mode!r}")
        self.mode = mode
        if not (isinstance(n_samples, int) and n_samples >= 1):
            raise ValueError(f"augmentation.n_samples must be a positive int; got {n_samples!r}")
        bad = sorted(set(learnable) - set(TRANSFORMS))
        if bad:
            raise ValueError(f"augmentation.learnable has unknown transform(s) {bad}; allowed: {list(TRANSFORMS)}")
        self.n_samples = n_samples
        self.register_buffer("eta", eta_vector(init))
        self.register_buffer("learnable", torch.tensor([n in set(learnable) for n in TRANSFORMS]))
        self.register_buffer("generators", _generators(), persistent=False)

    def sample_eps(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n, S, 6]`` draws of ``U(-1, 1)``."""
        u = torch.rand(n, self.n_samples, len(TRANSFORMS), generator=generator, device=self.eta.device)
        return (2 * u - 1).to(self.eta.dtype)

    def effective_eta(self, eta: torch.Tensor | None = None) -> torch.Tensor:
        """``[6]`` ranges in use: the learnable entries of ``eta`` (graph kept), the fixed ones from
        the buffer; rotation clamped to ``[-pi, pi]``."""
        if eta is None:
            eta = self.eta
        eta = torch.where(self.learnable, eta, self.eta.detach())
        return torch.cat([eta[:2], eta[2:3].clamp(-math.pi, math.pi), eta[3:]])

    def matrices(self, eps: torch.Tensor, eta: torch.Tensor | None = None) -> torch.Tensor:
        """``[n, S, 2, 3]`` affine matrices for ``eps`` ``[n, S, 6]``."""
        eta = self.effective_eta(eta).to(eps.dtype)
        M = torch.einsum("nsk,k,kij->nsij", eps, eta, self.generators.to(eps.dtype))
        return torch.linalg.matrix_exp(M)[..., :2, :]

    def forward(self, x: torch.Tensor, eps: torch.Tensor | None = None,
                eta: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"AffineAugmentation needs images [N, C, H, W]; got shape {tuple(x.shape)}")
        N, C, H, W = x.shape
        if eps is None:
            eps = self.sample_eps(N)
        if eps.shape != (N, self.n_samples, len(TRANSFORMS)):
            raise ValueError(f"eps must have shape {(N, self.n_samples, len(TRANSFORMS))}; got {tuple(eps.shape)}")
        theta = self.matrices(eps.to(x.dtype), eta).reshape(N * self.n_samples, 2, 3)
        grid = F.affine_grid(theta, [N * self.n_samples, C, H, W], align_corners=True)
        xs = x.unsqueeze(1).expand(N, self.n_samples, C, H, W).reshape(N * self.n_samples, C, H, W)
        return F.grid_sample(xs, grid, mode=self.mode, padding_mode="zeros", align_corners=True)

    def ranges(self) -> dict[str, float]:
        """``{transform name: |eta|}`` (for logging; ``U(-eta, eta)`` depends only on ``|eta|``)."""
        return {n: float(v) for n, v in zip(TRANSFORMS, self.effective_eta().detach().abs().cpu())}


class AugmentedModel(nn.Module):
    """``f(x) = mean_s net(T(x; eta * eps_s))``: logits ``[N, C]`` averaged over ``S`` samples.

    ``eps`` (``[N, S, 6]``) and ``eta`` may be passed to ``forward`` (tests, the differentiable
    marglik); ``frozen_eps`` (attribute, ``None`` by default) fixes the draws for every call."""

    def __init__(self, net: nn.Module, augmentation: AffineAugmentation):
        super().__init__()
        self.net = net
        self.augmentation = augmentation
        self.frozen_eps: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, eps: torch.Tensor | None = None,
                eta: torch.Tensor | None = None) -> torch.Tensor:
        if eps is None and self.frozen_eps is not None:
            eps = self.frozen_eps
        xs = self.augmentation(x, eps, eta)
        out = self.net(xs)
        return out.reshape(x.shape[0], self.augmentation.n_samples, *out.shape[1:]).mean(1)
