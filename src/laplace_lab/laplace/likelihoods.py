"""Likelihoods: negative log likelihood, output-space curvature factors, label sampling.

Hand-written (a few lines each; no library offers the heteroscedastic natural parameterisation).

Shapes: the network output ``f`` is reshaped to ``[N, C]`` (``C`` = number of outputs).
Every likelihood provides

- ``nll(f, y)``: summed negative log likelihood (a 0-dim tensor). For ``regression`` it is the
  *noise-free* loss ``0.5 * sum (f - y)^2`` (as in laplace-torch); the noise std sigma enters
  only through the Laplace object (factor ``1 / sigma^2`` and the normaliser).
- ``hessian_sqrt(f)``: ``V`` of shape ``[K, N, C]`` with ``sum_k V[k, n] V[k, n]^T`` equal to the
  Hessian of the per-sample NLL w.r.t. ``f[n]`` (unit noise for regression).
- ``grad(f, y)``: ``[N, C]`` per-sample gradient of the NLL w.r.t. ``f``.
- ``sample(f, generator)``: targets drawn from the model's predictive ``p(y | f)`` (unit noise for
  regression, matching curvlinops / laplace-torch's MC Fisher convention).

Heteroscedastic regression (natural parameterisation, Immer et al. 2023). For ``D`` targets the
network outputs ``2 D`` values: ``f[:, :D] = eta1`` and ``f[:, D:] = raw``, with
``eta2 = -softplus(raw) < 0``; mean ``= -eta1 / (2 eta2)``, variance ``= -1 / (2 eta2)``.
The NLL is ``A(eta) - eta1 y - eta2 y^2 + log(2 pi)/2`` with log partition
``A = -eta1^2 / (4 eta2) - log(-2 eta2) / 2``, convex in ``(eta1, eta2)``. Its Hessian in
``(eta1, eta2)`` is ``Cov[(y, y^2)] = [[s, 2ms], [2ms, 4m^2 s + 2 s^2]]`` (``m`` mean, ``s``
variance), factorised exactly as ``L L^T`` with ``L = [[sqrt(s), 0], [2 m sqrt(s), sqrt(2) s]]``.
The GGN we use is the GGN w.r.t. the natural parameters, with the link Jacobian
``d eta2 / d raw = -sigmoid(raw)`` folded into the network Jacobian: ``V = J_link^T L``. The
second-order term of the softplus link (curvature of the link times the gradient) is dropped,
so the GGN is PSD by construction.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from laplace_lab.laplace.options import Likelihood

LIKELIHOODS = Likelihood.values()


class Likelihood:
    name: str = ""

    def prepare(self, f: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reshape output to ``[N, C]`` and targets to the matching shape."""
        raise NotImplementedError

    def nll(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def hessian_sqrt(self, f: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def grad(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        f = f.detach().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(self.nll(f, y), f)
        return g

    def sample(self, f: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError


class Classification(Likelihood):
    """Categorical likelihood with softmax link; ``nll`` = summed cross-entropy."""

    name = "classification"

    def prepare(self, f, y):
        return f.reshape(f.shape[0], -1), y.reshape(-1).long()

    def nll(self, f, y):
        return F.cross_entropy(f, y, reduction="sum")

    def hessian_sqrt(self, f):
        # diag(p) - p p^T = sum_k sqrt(p_k)(e_k - p) (sqrt(p_k)(e_k - p))^T
        p = f.softmax(-1)  # [N, C]
        eye = torch.eye(p.shape[1], dtype=p.dtype, device=p.device)
        V = p.sqrt().T[:, :, None] * (eye[:, None, :] - p[None])  # [K=C, N, C]
        return V

    def grad(self, f, y):
        return f.softmax(-1) - F.one_hot(y, f.shape[1]).to(f.dtype)

    def sample(self, f, generator):
        return torch.multinomial(f.softmax(-1), 1, generator=generator).squeeze(-1)


class Regression(Likelihood):
    """Gaussian likelihood with identity link; ``nll`` = ``0.5 * sum (f - y)^2`` (unit noise)."""

    name = "regression"

    def prepare(self, f, y):
        f = f.reshape(f.shape[0], -1)
        return f, y.reshape(f.shape).to(f.dtype)

    def nll(self, f, y):
        return 0.5 * (f - y).square().sum()

    def hessian_sqrt(self, f):
        N, C = f.shape
        eye = torch.eye(C, dtype=f.dtype, device=f.device)
        return eye[:, None, :].expand(C, N, C)

    def grad(self, f, y):
        return f - y

    def sample(self, f, generator):
        eps = torch.randn(f.shape, generator=generator, dtype=f.dtype, device=f.device)
        return f + eps


class HeteroscedasticRegression(Likelihood):
    """Gaussian with natural parameters; see the module docstring for layout and GGN."""

    name = "heteroscedastic_regression"

    @staticmethod
    def natural(f):
        D = f.shape[1] // 2
        eta1, raw = f[:, :D], f[:, D:]
        return eta1, -F.softplus(raw), raw

    @classmethod
    def mean_var(cls, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance ``[N, D]`` from the raw output ``[N, 2D]``."""
        eta1, eta2, _ = cls.natural(f)
        return -eta1 / (2 * eta2), -1 / (2 * eta2)

    def prepare(self, f, y):
        f = f.reshape(f.shape[0], -1)
        if f.shape[1] % 2:
            raise ValueError(
                "likelihood='heteroscedastic_regression' needs 2 outputs per target (eta1, raw); "
                f"got {f.shape[1]} outputs"
            )
        return f, y.reshape(f.shape[0], f.shape[1] // 2).to(f.dtype)

    def nll(self, f, y):
        eta1, eta2, _ = self.natural(f)
        ll = (eta1 * y + eta2 * y.square() + eta1.square() / (4 * eta2)
              + 0.5 * torch.log(-2 * eta2) - 0.5 * math.log(2 * math.pi))
        return -ll.sum()

    def hessian_sqrt(self, f):
        N, C = f.shape
        D = C // 2
        m, s = self.mean_var(f)
        dlink = -torch.sigmoid(f[:, D:])  # d eta2 / d raw
        V = f.new_zeros(C, N, C)
        idx = torch.arange(D, device=f.device)
        rs = s.sqrt()
        V[idx, :, idx] = rs.T
        V[idx, :, D + idx] = (dlink * 2 * m * rs).T
        V[D + idx, :, D + idx] = (dlink * math.sqrt(2.0) * s).T
        return V

    def sample(self, f, generator):
        m, s = self.mean_var(f)
        return m + s.sqrt() * torch.randn(m.shape, generator=generator, dtype=m.dtype, device=m.device)


def get_likelihood(name: str) -> Likelihood:
    classes = {c.name: c for c in (Classification, Regression, HeteroscedasticRegression)}
    if name not in classes:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}; got {name!r}")
    return classes[name]()
