"""Kronecker-factored curvature (KFAC for Linear and Conv2d; diagonal for the rest).

Hand-written factors (``modules.kfac_factors``): one backward of the ``K`` output factors gives
``G``, the forward gives ``A``; no per-sample gradients are formed. Blocks, one per parameter
tensor in subset order (so a layerwise prior has one ``delta`` per block, as in laplace-torch):

Block types (small classes below, one per parameter tensor):

- ``KronWeightBlock`` (a weight): ``H_w ~= G (x) A``; by default (option ``kfac_approx="expand"``)
  ``A = sum_{n,s} a a^T / rows`` (``rows`` = data points x weight-sharing positions) and
  ``G = sum_{k,n,s} g g^T`` (curvlinops' KFAC-expand normalisation, separate weight and bias: the
  factors of laplace-torch's default ``CurvlinopsGGN``); ``"reduce"`` and ``"backpack"`` for layers
  with weight sharing: ``options.KfacApprox``. ``weight.flatten()`` order is ``(out, in)``.
- ``KronBiasBlock`` (a bias of such a layer): ``H_b ~= G`` (the same ``G``).
- ``DiagBlock`` (any other parameter tensor, e.g. BatchNorm): exact diagonal of its GGN block.

``finalize`` eigendecomposes each factor once (``G = Q_G diag(lamG) Q_G^T``, same for ``A``;
negative round-off eigenvalues clipped to 0). With ``c`` and a per-block precision ``delta`` the
eigenvalues of a block of the posterior precision are ``c * lamG_i * lamA_j + delta`` exactly, so
log det, sampling and the covariance are exact for the KFAC posterior with scalar/layerwise
priors. Diagonal (per-parameter) priors are rejected at construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from laplace_lab.io.fields import option
from laplace_lab.laplace.modules import diag_sq, is_kfac_module, kfac_factors
from laplace_lab.laplace.options import KfacApprox
from laplace_lab.laplace.plan_terms import MemoryPlan, backend_batch_bytes, glm_bytes_per_input
from laplace_lab.laplace.priors import per_layer
from laplace_lab.laplace.structures.base import Structure, register


class KronBlock:
    """One parameter tensor's curvature block in its eigenbasis. ``kind`` ("kron" | "kron1" | "diag")
    is a label for serialisation and reading; behaviour lives in the methods."""

    kind = ""

    def curvature_eigenvalues(self) -> torch.Tensor:
        """Eigenvalues of the curvature block, shaped like the block's coordinates."""
        raise NotImplementedError

    def eigenvector(self, j: int) -> torch.Tensor:
        """The unit eigenvector of flat eigenvalue index ``j`` (of ``curvature_eigenvalues().reshape(-1)``),
        flat in the block's coordinates."""
        raise NotImplementedError

    def eigvals(self, c, delta) -> torch.Tensor:
        """Eigenvalues of ``c H_block + delta``."""
        return c * self.curvature_eigenvalues() + delta

    def apply(self, X: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``Q diag(scale) Q^T X`` for ``X`` ``[..., block numel]``."""
        raise NotImplementedError

    def gram(self, J: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        """``J Q diag(inv) Q^T J^T`` for ``J`` ``[N, C, block numel]`` -> ``[N, C, C]``."""
        raise NotImplementedError

    def marginal_variance(self, inv: torch.Tensor) -> torch.Tensor:
        """Diagonal of ``Q diag(inv) Q^T``, flat."""
        raise NotImplementedError

    def row_spec(self, inv: torch.Tensor):
        """The predictive's per-tensor spec ``(kind, QG, QA, weights)`` (``functional_variance``), or
        ``None`` for an elementwise block (the view then uses ``inv`` as variances)."""
        return None


class KronWeightBlock(KronBlock):
    """``G (x) A`` of a Linear / Conv weight: eigenpairs ``(lamG, QG)``, ``(lamA, QA)``."""

    kind = "kron"

    def __init__(self, lamG, QG, lamA, QA):
        self.lamG, self.QG, self.lamA, self.QA = lamG, QG, lamA, QA

    def curvature_eigenvalues(self):
        return torch.outer(self.lamG, self.lamA)

    def eigenvector(self, j):
        g, a = divmod(j, self.lamA.numel())  # weight.flatten() is (out, in): G's index is the outer one
        return torch.outer(self.QG[:, g], self.QA[:, a]).reshape(-1)

    def apply(self, X, scale):
        QG, QA = self.QG, self.QA
        Z = X.reshape(*X.shape[:-1], QG.shape[0], QA.shape[0])
        Z = QG.T @ Z @ QA
        Z = QG @ (Z * scale) @ QA.T
        return Z.reshape(X.shape)

    def gram(self, J, inv):
        QG, QA = self.QG, self.QA
        Jt = QG.T @ J.reshape(*J.shape[:-1], QG.shape[0], QA.shape[0]) @ QA
        return torch.einsum("ncij,nkij->nck", Jt * inv, Jt)

    def marginal_variance(self, inv):
        return (self.QG.square() @ inv @ self.QA.square().T).reshape(-1)

    def row_spec(self, inv):
        return ("w", self.QG, self.QA, inv)


class KronBiasBlock(KronBlock):
    """``G`` of the bias of a KFAC layer (shares ``(lamG, QG)`` with its weight)."""

    kind = "kron1"

    def __init__(self, lamG, QG):
        self.lamG, self.QG = lamG, QG

    def curvature_eigenvalues(self):
        return self.lamG

    def eigenvector(self, j):
        return self.QG[:, j]

    def apply(self, X, scale):
        return ((X @ self.QG) * scale) @ self.QG.T

    def gram(self, J, inv):
        Jt = J @ self.QG
        return torch.einsum("nci,nki->nck", Jt * inv, Jt)

    def marginal_variance(self, inv):
        return self.QG.square() @ inv

    def row_spec(self, inv):
        return ("b", self.QG, None, inv)


class DiagBlock(KronBlock):
    """Exact GGN diagonal ``h`` of a tensor without a Kronecker factorisation (e.g. BatchNorm)."""

    kind = "diag"

    def __init__(self, h):
        self.h = h

    def curvature_eigenvalues(self):
        return self.h

    def eigenvector(self, j):
        e = torch.zeros_like(self.h)
        e[j] = 1.0
        return e

    def apply(self, X, scale):
        return X * scale

    def gram(self, J, inv):
        return torch.einsum("nci,nki->nck", J * inv, J)

    def marginal_variance(self, inv):
        return inv


@register
class KronStructure(Structure):
    supports_fused = True
    factor_chunks = True
    name = "kron"
    label = "KFAC"
    shard_reduction = "sum"
    prior_structures = ("scalar", "layerwise")
    any_block_order = True

    @dataclass(frozen=True)
    class Options:
        """``kfac_approx``: the KFAC convention of layers with weight sharing (``KfacApprox``: expand =
        curvlinops' default, what laplace-torch's default backend gives | reduce (Eschenhagen et al.
        2023) | backpack = BackPack's KFLR / KFAC); plain Linear layers on ``[N, D]`` are the same under all."""

        kfac_approx: str = option("expand", "str", choices=KfacApprox.values())

    def __init__(self, entries, device, dtype, kfac_approx: str = Options.kfac_approx):
        self.kfac_approx = self.check_options({"kfac_approx": kfac_approx}).kfac_approx
        super().__init__(entries, device, dtype)

    def reset(self):
        # raw sums per entry (module): A_sum, G, rows for KFAC modules; diag for others
        self.raw: list[dict] = [{} for _ in self.entries]
        self.blocks: list[KronBlock] = []

    @property
    def H(self) -> list[KronBlock]:
        return self.blocks

    def load_layer_curvature(self, parts: list[dict]) -> None:
        """``parts[i]``: entry i's raw sums as ``accumulate`` keeps them (a dict of factor sums)."""
        if len(parts) != len(self.entries):
            raise ValueError(f"load_layer_curvature: {len(parts)} parts for {len(self.entries)} layers")
        self.raw = [dict(part) for part in parts]

    def accumulate(self, records, inputs: bool = True):
        for e, r, raw in zip(self.entries, records, self.raw):
            if not r.calls:
                continue
            if is_kfac_module(e.module):
                A, G, rows = kfac_factors(e.module, r.calls, self.kfac_approx, inputs=inputs)
                for key, val in (("A", A), ("G", G), ("rows", rows)) if inputs else (("G", G),):
                    raw[key] = raw[key] + val if key in raw else val
            else:
                d = diag_sq(e.module, e.names, r.calls)
                for n in e.names:
                    raw[n] = raw[n] + d[n] if n in raw else d[n]

    def shard_sums(self):
        """``"<entry>.<key>"``: each entry's raw sums (``A``, ``G``, ``rows`` as an int64 tensor; or the
        diagonal of a non-KFAC tensor). A module never called on this rank has no keys, so an empty
        shard shows up in the engine's agreement check."""
        return {f"{i}.{k}": (torch.as_tensor(v, device=self.device) if k == "rows" else v)
                for i, raw in enumerate(self.raw) for k, v in sorted(raw.items())}

    def set_shard_sums(self, sums):
        for name, v in sums.items():
            i, k = name.split(".", 1)
            self.raw[int(i)][k] = int(v.item()) if k == "rows" else v

    @staticmethod
    def _eigh(M):
        try:
            lam, Q = torch.linalg.eigh(M)
            ok = bool(torch.isfinite(lam).all())
        except torch.linalg.LinAlgError:  # float32 LAPACK can fail to converge on rank-deficient
            # factors (seen for A of an augmented MLP on 128 MNIST images); the same decomposition in float64
            ok = False
        if not ok:  # raised, or returned NaN (A of a plain MLP 784-200-10 on 200 MNIST images, float32)
            lam, Q = (t.to(M.dtype) for t in torch.linalg.eigh(M.double()))
        return lam.clamp_min(0), Q

    def finalize(self):
        self.blocks = []
        for e, raw in zip(self.entries, self.raw):
            kfac = is_kfac_module(e.module)
            if kfac and "G" in raw:
                lamG, QG = self._eigh(raw["G"])
                lamA, QA = self._eigh(raw["A"] / raw["rows"])
            for n in e.names:
                p = getattr(e.module, n)
                if kfac and "G" not in raw:  # module never called: zero curvature
                    self.blocks.append(DiagBlock(torch.zeros_like(p).reshape(-1)))
                elif kfac and n == "weight":
                    self.blocks.append(KronWeightBlock(lamG, QG, lamA, QA))
                elif kfac:
                    self.blocks.append(KronBiasBlock(lamG, QG))
                else:
                    self.blocks.append(DiagBlock(raw.get(n, torch.zeros_like(p)).reshape(-1)))

    # ---- per-block eigenvalues of the posterior precision ---------------------------------------
    def deltas(self, prior):
        """``[L]`` per-block prior precisions."""
        return per_layer(prior, self.sizes)

    def logdet(self, c, prior):
        return self.logdet_by_tensor(c, prior).sum()

    def logdet_by_tensor(self, c, prior):
        return torch.stack([b.eigvals(c, d).log().sum() for b, d in zip(self.blocks, self.deltas(prior))])

    def _map(self, X, c, prior, power):
        """``(c H + delta)^power X`` for ``X`` [..., P]."""
        out, i = [], 0
        for b, d, size in zip(self.blocks, self.deltas(prior), self.sizes):
            out.append(b.apply(X[..., i:i + size], b.eigvals(c, d) ** power))
            i += size
        return torch.cat(out, -1)

    def sample(self, n, c, prior, generator=None):
        return self._map(self.randn(n, self.n_params, generator=generator), c, prior, -0.5)

    def functional_variance(self, Js, c, prior):
        out, i = 0, 0
        for b, d, size in zip(self.blocks, self.deltas(prior), self.sizes):
            out = out + b.gram(Js[..., i:i + size], 1.0 / b.eigvals(c, d))
            i += size
        return out

    def posterior_variance(self, c, prior):
        return torch.cat([b.marginal_variance(1.0 / b.eigvals(c, d)) for b, d in zip(self.blocks, self.deltas(prior))])

    def curvature_eigenvalues(self):
        return torch.cat([b.curvature_eigenvalues().reshape(-1) for b in self.blocks])

    def square_norm(self, v, c, prior):
        return v @ self._map(v, c, prior, 1.0)

    def curvature_top_eigenvectors(self, k):
        """The ``k`` largest eigenpairs over every block (each eigenvector lives in one tensor)."""
        found = []  # (eigenvalue, block, flat index in the block)
        for i, b in enumerate(self.blocks):
            lam = b.curvature_eigenvalues().reshape(-1)
            top = lam.topk(min(k, lam.numel()))
            found += [(v, i, j) for v, j in zip(top.values.tolist(), top.indices.tolist())]
        found = sorted(found, key=lambda t: -t[0])[:k]
        offsets = [0, *torch.tensor(self.sizes).cumsum(0).tolist()]
        U = torch.zeros(self.n_params, len(found), device=self.device, dtype=self.dtype)
        for col, (_, i, j) in enumerate(found):
            U[offsets[i]:offsets[i + 1], col] = self.blocks[i].eigenvector(j)
        return torch.tensor([v for v, _, _ in found], device=self.device, dtype=self.dtype), U

    def posterior_view(self, la):
        from laplace_lab.laplace.functional_variance import LayerwiseView

        c, prior = la.H_factor, la.structure_prior
        rows = []
        for b, d in zip(self.blocks, self.deltas(prior)):
            inv = 1.0 / b.eigvals(c, d)
            rows.append(b.row_spec(inv) or inv)
        return LayerwiseView(la, rows)

    def precision(self, c, prior):
        return KronPrecision(self, c, prior)

    @property
    def factors(self) -> list[list[torch.Tensor]]:
        """Un-decomposed factors per parameter tensor: ``[G, A]`` (weight; ``A`` normalised by rows),
        ``[G]`` (bias of that layer) or ``[h]`` (diagonal block)."""
        out = []
        for e, raw in zip(self.entries, self.raw):
            kfac = is_kfac_module(e.module) and "G" in raw
            for n in e.names:
                if kfac:
                    out.append([raw["G"], raw["A"] / raw["rows"]] if n == "weight" else [raw["G"]])
                else:
                    out.append([raw.get(n, torch.zeros_like(getattr(e.module, n))).reshape(-1)])
        return out

    def preconditioner(self, c, prior):
        """The KFAC posterior covariance, applied blockwise in the eigenbases."""
        return lambda R: self.power_map(R.T, c, prior, -1.0).T

    def power_map(self, X, c, prior, power):
        """``(c H + diag(prior))^power X`` for ``X`` ``[..., P]`` (blockwise in the eigenbases)."""
        return self._map(X, c, prior, power)

    def dense_precision(self, c, prior):
        eye = torch.eye(self.n_params, device=self.device, dtype=self.dtype)
        return self._map(eye, c, prior, 1.0)

    # ---- memory plan (laplace.plan) --------------------------------------------------------
    @classmethod
    def memory_plan(cls, shape, batch, n_factors, options):
        """Raw factor sums ``A`` ``[d_in, d_in]`` and ``G`` ``[d_out, d_out]`` per Linear / Conv2d
        (a diagonal for other tensors), then their eigenbases (same sizes) from ``finalize``. Fit
        peak: the larger of (raw sums + one batch + one layer's new factors and their sums) and (raw sums + eigenbases + the largest ``eigh``'s input copy and
        workspace, about ``3 d^2``). Predictive: the inverse eigenvalues ``[d_out, d_in]`` per
        layer; samples: three ``[P]`` vectors per draw."""
        b, P = shape.itemsize, shape.n_params
        kf = [lay for lay in shape.layers if lay.kfac]
        raw = sum(lay.d_in ** 2 + lay.d_out ** 2 for lay in kf) + sum(lay.numel for lay in shape.layers
                                                                        if not lay.kfac)
        eig = sum(lay.d_in ** 2 + lay.d_out ** 2 + lay.d_in + lay.d_out for lay in kf)
        acc = max([2 * (lay.d_in ** 2 + lay.d_out ** 2) for lay in kf], default=0)
        fin = 3 * max([d for lay in kf for d in (lay.d_in, lay.d_out)], default=0) ** 2
        parts = backend_batch_bytes(shape, batch, n_factors, cls.factor_chunks)
        batch_peak = sum(parts.values()) + b * acc
        parts = {"factor sums": b * raw, **parts, "layer factors": b * acc}
        if b * (eig + fin) > batch_peak:
            parts = {"factor sums": b * raw, "eigenbases": b * eig, "eigh workspace": b * fin}
        return MemoryPlan(state=b * (raw + eig), fit=sum(parts.values()),
                          predict_fixed=b * sum(lay.d_in * lay.d_out for lay in kf),
                          predict_per_input=glm_bytes_per_input(shape), sample_fixed=0,
                          sample_per_draw=3 * b * P, parts=parts)

    def state_dict(self):
        return {"raw": self.raw, "kfac_approx": self.kfac_approx}

    def load_state_dict(self, sd):
        saved = sd.get("kfac_approx", "expand")  # states saved before the option existed: expand
        if saved != self.kfac_approx:
            raise ValueError(f"state was fitted with kfac_approx={saved!r}; this Laplace has "
                             f"kfac_approx={self.kfac_approx!r} (structure_options)")
        self.raw = [
            {k: (v.to(self.device, self.dtype) if isinstance(v, torch.Tensor) else v) for k, v in r.items()}
            for r in sd["raw"]
        ]
        self.finalize()


class KronPrecision:
    """Read-only view of the KFAC posterior precision ``c H + diag(prior)`` (laplace-torch's
    ``KronDecomposed`` methods): ``logdet()``, ``to_matrix(exponent)`` ``[P, P]``, ``bmm(X, exponent)``."""

    def __init__(self, structure: KronStructure, c, prior):
        self.structure, self.c, self.prior = structure, c, prior

    def logdet(self) -> torch.Tensor:
        return self.structure.logdet(self.c, self.prior)

    def bmm(self, X: torch.Tensor, exponent: float = 1.0) -> torch.Tensor:
        """``P^exponent X`` for ``X`` ``[..., P]``."""
        return self.structure.power_map(X, self.c, self.prior, exponent)

    def to_matrix(self, exponent: float = 1.0) -> torch.Tensor:
        s = self.structure
        return self.bmm(torch.eye(s.n_params, device=s.device, dtype=s.dtype), exponent)
