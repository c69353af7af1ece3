"""Matrix-free GGN (and empirical Fisher) operator: ``V -> sum_n J_n^T M_n J_n V``.

Hand-written on ``torch.func`` (``functional_call``, ``jvp``, ``vjp``, ``vmap``): per data chunk,
one forward + ``vjp`` (keeps the chunk's graph), one ``jvp`` batched over the ``b`` input vectors
(``vmap``), the output-space product with ``M_n = sum_k v_nk v_nk^T`` (``v`` from
``output_factors.output_factors``, ``[K, N, C]``) and the ``vjp`` batched over the ``b`` results.
curvlinops' ``GGNLinearOperator`` does the same for one vector at a time (through double
backward); we keep our own because it batches over vectors (CG over many samples, the
functional-variance jvps) and shares the likelihood factors of the engine (heteroscedastic
natural parameters), and the tests cross-check the two.

Exact for any model (no structural approximation); memory grows with ``chunk_size x b``
(activations of a chunk times the number of vectors in flight, capped by ``vec_chunk``), never
with ``P^2``. Runs on the device and in the dtype of the parameters.

Conventions: the flat parameter vector is the concatenation of ``p.flatten()`` of ``params`` (the
Laplace subset order); the network output is flattened to ``[N, C]``; ``H`` is computed with unit
noise (the Laplace object scales it by ``c = 1 / (sigma^2 T)``). The model should be in eval mode
(BatchNorm with running statistics), which ``Laplace.fit`` ensures.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

from laplace_lab.laplace.likelihoods import Likelihood, get_likelihood
from laplace_lab.laplace.output_factors import output_factors

OPERATOR_CURVATURE_TYPES = ("ggn", "ef")  # deterministic curvatures (mc_fisher would change per product)


class GGNOperator:
    """Symmetric PSD linear operator ``[P, P]`` of the GGN (``curvature="ggn"``) or the empirical
    Fisher (``"ef"``) summed over ``data``.

    Args:
        model: the network (its current weights are the linearisation point).
        likelihood: "classification" | "regression" | "heteroscedastic_regression" or a
            ``Likelihood``.
        data: a re-iterable of ``(X, y)`` batches (a DataLoader or a list); iterated once per product.
        params: the parameter tensors of the subset (default: every parameter requiring grad).
        curvature: "ggn" | "ef".
        chunk_size: inputs per forward (``None``: the loader's batches as they come).
        vec_chunk: vectors per ``vmap``-ed jvp/vjp (``None``: all at once).

    ``op @ v`` for ``v`` ``[P]`` or ``[P, b]``; ``op.matmat(V)``; ``op.shape == (P, P)``.
    """

    def __init__(self, model: nn.Module, likelihood: str | Likelihood, data: Iterable,
                 params: list[torch.Tensor] | None = None, curvature: str = "ggn",
                 chunk_size: int | None = None, vec_chunk: int | None = None):
        if curvature not in OPERATOR_CURVATURE_TYPES:
            raise ValueError(f"curvature must be one of {OPERATOR_CURVATURE_TYPES} for the matrix-free "
                             f"GGN operator; got {curvature!r}")
        for opt, val in (("chunk_size", chunk_size), ("vec_chunk", vec_chunk)):
            if val is not None and not (isinstance(val, int) and val >= 1):
                raise ValueError(f"{opt} must be a positive int or None; got {val!r}")
        self.model = model
        self.lik = get_likelihood(likelihood) if isinstance(likelihood, str) else likelihood
        self.data = data
        self.curvature = curvature
        self.chunk_size, self.vec_chunk = chunk_size, vec_chunk
        params = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
        by_id = {id(p): n for n, p in model.named_parameters()}
        missing = [i for i, p in enumerate(params) if id(p) not in by_id]
        if missing:
            raise ValueError(f"params {missing} are not parameters of the model")
        self.params = params
        self.names = [by_id[id(p)] for p in params]
        self.shapes = [p.shape for p in params]
        self.sizes = [p.numel() for p in params]
        self.n_params = sum(self.sizes)
        self.device, self.dtype = params[0].device, params[0].dtype
        self.n_products = 0  # number of (batched) operator applications, for benchmarks

    # ---- helpers ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_params, self.n_params)

    def primals(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in zip(self.names, self.params)}

    def unflatten(self, V: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[b, P]`` -> ``{name: [b, *shape]}``."""
        return {n: c.reshape(V.shape[0], *s)
                for n, c, s in zip(self.names, torch.split(V, self.sizes, dim=1), self.shapes)}

    def flatten(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        """``{name: [b, *shape]}`` -> ``[b, P]``."""
        return torch.cat([d[n].reshape(d[n].shape[0], -1) for n in self.names], 1)

    def forward_fn(self, X):
        """``theta_dict -> f [N, C]`` at inputs ``X`` (other parameters and buffers fixed)."""
        def f(p):
            out = functional_call(self.model, p, (X,), strict=False)
            return out.reshape(out.shape[0], -1)
        return f

    def chunks(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """The data as ``(X, y)`` chunks of at most ``chunk_size`` inputs, on the device."""
        for X, y in self.data:
            X = X.to(self.device, self.dtype) if X.is_floating_point() else X.to(self.device)
            y = y.to(self.device)
            if self.chunk_size is None:
                yield X, y
                continue
            for i in range(0, X.shape[0], self.chunk_size):
                yield X[i:i + self.chunk_size], y[i:i + self.chunk_size]

    def factors(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``[K, N, C]`` output-space square-root factors of ``M_n`` at outputs ``f``."""
        f, yy = self.lik.prepare(f, y)
        return output_factors(self.lik, self.curvature, f.detach(), yy)

    # ---- products ----------------------------------------------------------------------------
    def jvp(self, X: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f [N, C], J V [b, N, C])`` for ``V`` ``[b, P]`` at inputs ``X`` (one chunk)."""
        fn, prim = self.forward_fn(X), self.primals()

        def one(t):
            return jvp(fn, (prim,), (t,))

        with torch.no_grad():
            f, JV = vmap(one, out_dims=(None, 0), chunk_size=self.vec_chunk)(self.unflatten(V))
        return f, JV

    def _chunk_matmat(self, X, y, V: torch.Tensor) -> torch.Tensor:
        fn, prim = self.forward_fn(X), self.primals()
        with torch.no_grad():
            f, vjp_fn = vjp(fn, prim)
            F = self.factors(f, y)  # [K, N, C]
            JV = vmap(lambda t: jvp(fn, (prim,), (t,))[1], chunk_size=self.vec_chunk)(self.unflatten(V))
            MJV = torch.einsum("knc,bkn->bnc", F, torch.einsum("knc,bnc->bkn", F, JV))  # M_n J_n v
            out = vmap(vjp_fn, chunk_size=self.vec_chunk)(MJV)[0]
        return self.flatten(out)

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        """``H V`` for ``V`` ``[P, b]`` -> ``[P, b]`` (one pass over the data)."""
        if V.ndim != 2 or V.shape[0] != self.n_params:
            raise ValueError(f"V must have shape [P={self.n_params}, b]; got {tuple(V.shape)}")
        Vt = V.T.to(self.dtype).contiguous()
        out = torch.zeros_like(Vt)
        for X, y in self.chunks():
            out += self._chunk_matmat(X, y, Vt)
        self.n_products += 1
        return out.T

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``H v`` for ``v`` ``[P]``."""
        return self.matmat(v.reshape(-1, 1))[:, 0]

    def __matmul__(self, V: torch.Tensor) -> torch.Tensor:
        return self.matvec(V) if V.ndim == 1 else self.matmat(V)

    def jt_msqrt(self, n_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[P, S]`` draws of ``sum_n J_n^T M_n^{1/2} eps_n`` (covariance ``H``): ``S`` standard
        normal ``eps`` in the ``[K, N]`` factor space per chunk, one batched vjp per chunk."""
        out = torch.zeros(n_samples, self.n_params, device=self.device, dtype=self.dtype)
        for X, y in self.chunks():
            fn, prim = self.forward_fn(X), self.primals()
            with torch.no_grad():
                f, vjp_fn = vjp(fn, prim)
                F = self.factors(f, y)  # [K, N, C]
                eps = torch.randn(n_samples, *F.shape[:2], generator=generator, device=self.device,
                                  dtype=self.dtype)
                U = torch.einsum("knc,skn->snc", F, eps)
                out += self.flatten(vmap(vjp_fn, chunk_size=self.vec_chunk)(U)[0])
        return out.T

    def jacobian(self, X: torch.Tensor) -> torch.Tensor:
        """Per-input Jacobians ``[N, C, P]`` of one chunk (memory ``N C P``: small chunks only)."""
        prim = self.primals()

        def one(x):
            def f(p):
                return functional_call(self.model, p, (x[None],), strict=False).reshape(-1)
            return self.flatten(jacrev(f)(prim))  # {name: [C, *shape]} -> [C, P]

        with torch.no_grad():
            return vmap(one)(X)

    @torch.no_grad()
    def loss(self) -> tuple[torch.Tensor, int, int]:
        """``(summed NLL, n_data, n_outputs)`` over the data at the current weights (unit noise)."""
        total = torch.zeros((), device=self.device, dtype=self.dtype)
        n, C = 0, None
        for X, y in self.chunks():
            f, yy = self.lik.prepare(self.model(X), y)
            total = total + self.lik.nll(f, yy)
            n, C = n + f.shape[0], f.shape[1]
        return total, n, C

    def to_dense(self) -> torch.Tensor:
        """``[P, P]`` (tests and tiny models only)."""
        return self.matmat(torch.eye(self.n_params, device=self.device, dtype=self.dtype))


__all__ = ["GGNOperator", "OPERATOR_CURVATURE_TYPES"]
