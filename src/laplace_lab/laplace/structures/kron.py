"""Kronecker-factored curvature (KFAC-expand for Linear and Conv2d; diagonal for the rest).

Hand-written factors (``modules.kfac_factors``): one backward of the ``K`` output factors gives
``G``, the forward gives ``A``; no per-sample gradients are formed. Blocks, one per parameter
tensor in subset order (so a layerwise prior has one ``delta`` per block, as in laplace-torch):

- ``"kron"`` (a weight): ``H_w ~= G (x) A`` with ``A = sum_{n,s} a a^T / rows`` (``rows`` = data
  points x weight-sharing positions) and ``G = sum_{k,n,s} g g^T`` (curvlinops' KFAC-expand
  normalisation, separate weight and bias); ``weight.flatten()`` order is ``(out, in)``.
- ``"kron1"`` (a bias of such a layer): ``H_b ~= G`` (the same ``G``).
- ``"diag"`` (any other parameter tensor, e.g. BatchNorm): exact diagonal of its GGN block.

``finalize`` eigendecomposes each factor once (``G = Q_G diag(lamG) Q_G^T``, same for ``A``;
negative round-off eigenvalues clipped to 0). With ``c`` and a per-block precision ``delta`` the
eigenvalues of a block of the posterior precision are ``c * lamG_i * lamA_j + delta`` exactly, so
log det, sampling and the covariance are exact for the KFAC posterior with scalar/layerwise
priors. Diagonal (per-parameter) priors are rejected at construction.
"""

from __future__ import annotations

import torch

from laplace_lab.laplace.modules import diag_sq, is_kfac_module, kfac_factors
from laplace_lab.laplace.priors import per_layer
from laplace_lab.laplace.structures.base import Structure


class KronStructure(Structure):
    name = "kron"
    prior_structures = ("scalar", "layerwise")

    def reset(self):
        # raw sums per entry (module): A_sum, G, rows for KFAC modules; diag for others
        self.raw: list[dict] = [{} for _ in self.entries]
        self.blocks: list[dict] = []

    def accumulate(self, records):
        for e, r, raw in zip(self.entries, records, self.raw):
            if not r.calls:
                continue
            if is_kfac_module(e.module):
                A, G, rows = kfac_factors(e.module, r.calls)
                for key, val in (("A", A), ("G", G), ("rows", rows)):
                    raw[key] = raw[key] + val if key in raw else val
            else:
                d = diag_sq(e.module, e.names, r.calls)
                for n in e.names:
                    raw[n] = raw[n] + d[n] if n in raw else d[n]

    @staticmethod
    def _eigh(M):
        try:
            lam, Q = torch.linalg.eigh(M)
        except torch.linalg.LinAlgError:  # float32 LAPACK can fail to converge on rank-deficient
            # factors (seen for A of an augmented MLP on 128 MNIST images); the same decomposition in float64
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
                    self.blocks.append({"kind": "diag", "h": torch.zeros_like(p).reshape(-1)})
                elif kfac and n == "weight":
                    self.blocks.append({"kind": "kron", "lamG": lamG, "QG": QG, "lamA": lamA, "QA": QA})
                elif kfac:
                    self.blocks.append({"kind": "kron1", "lamG": lamG, "QG": QG})
                else:
                    h = raw.get(n, torch.zeros_like(p)).reshape(-1)
                    self.blocks.append({"kind": "diag", "h": h})

    # ---- per-block eigenvalues of the posterior precision ---------------------------------------
    def _eigvals(self, b, c, delta):
        if b["kind"] == "kron":
            return c * torch.outer(b["lamG"], b["lamA"]) + delta
        if b["kind"] == "kron1":
            return c * b["lamG"] + delta
        return c * b["h"] + delta

    def _deltas(self, prior):
        return per_layer(prior, self.sizes)

    def logdet(self, c, prior):
        deltas = self._deltas(prior)
        return sum(self._eigvals(b, c, d).log().sum() for b, d in zip(self.blocks, deltas))

    def _apply(self, b, X, scale):
        """Map block coordinates ``X`` [..., block numel] by ``Q diag(scale) Q^T`` (eigenbasis)."""
        if b["kind"] == "kron":
            QG, QA = b["QG"], b["QA"]
            Z = X.reshape(*X.shape[:-1], QG.shape[0], QA.shape[0])
            Z = QG.T @ Z @ QA
            Z = QG @ (Z * scale) @ QA.T
            return Z.reshape(X.shape)
        if b["kind"] == "kron1":
            QG = b["QG"]
            return ((X @ QG) * scale) @ QG.T
        return X * scale

    def _map(self, X, c, prior, power):
        """``(c H + delta)^power X`` for ``X`` [..., P]."""
        out, i = [], 0
        for b, d, size in zip(self.blocks, self._deltas(prior), self.sizes):
            out.append(self._apply(b, X[..., i:i + size], self._eigvals(b, c, d) ** power))
            i += size
        return torch.cat(out, -1)

    def sample(self, n, c, prior, generator=None):
        return self._map(self._randn(n, self.n_params, generator=generator), c, prior, -0.5)

    def functional_variance(self, Js, c, prior):
        out, i = 0, 0
        for b, d, size in zip(self.blocks, self._deltas(prior), self.sizes):
            J = Js[..., i:i + size]
            inv = 1.0 / self._eigvals(b, c, d)
            if b["kind"] == "kron":
                QG, QA = b["QG"], b["QA"]
                Jt = QG.T @ J.reshape(*J.shape[:-1], QG.shape[0], QA.shape[0]) @ QA
                out = out + torch.einsum("ncij,nkij->nck", Jt * inv, Jt)
            elif b["kind"] == "kron1":
                Jt = J @ b["QG"]
                out = out + torch.einsum("nci,nki->nck", Jt * inv, Jt)
            else:
                out = out + torch.einsum("nci,nki->nck", J * inv, J)
            i += size
        return out

    def posterior_variance(self, c, prior):
        out = []
        for b, d in zip(self.blocks, self._deltas(prior)):
            inv = 1.0 / self._eigvals(b, c, d)
            if b["kind"] == "kron":
                out.append((b["QG"].square() @ inv @ b["QA"].square().T).reshape(-1))
            elif b["kind"] == "kron1":
                out.append(b["QG"].square() @ inv)
            else:
                out.append(inv)
        return torch.cat(out)

    def dense_precision(self, c, prior):
        eye = torch.eye(self.n_params, device=self.device, dtype=self.dtype)
        return self._map(eye, c, prior, 1.0)

    def state_dict(self):
        return {"raw": self.raw}

    def load_state_dict(self, sd):
        self.raw = [
            {k: (v.to(self.device, self.dtype) if isinstance(v, torch.Tensor) else v) for k, v in r.items()}
            for r in sd["raw"]
        ]
        self.finalize()
