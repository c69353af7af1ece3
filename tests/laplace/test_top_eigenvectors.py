"""``Structure.curvature_top_eigenvectors`` (full, kron per-layer eigenbases, lowrank) against the
dense float64 curvature each structure represents, and lowrank's matrix-free ``square_norm``."""

from __future__ import annotations

import pytest
import torch

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.structures import STRUCTURES
from laplace_lab.laplace.structures.base import offers_eigenvectors
from tests.laplace.laplace_refs import cnn, data, loader, mlp

K = 4


def _fitted(kind, structure):
    model = mlp() if kind == "mlp" else cnn()
    X, y = data(kind, "classification")
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure,
                 prior_precision=0.5, **({"n_eigs": 200} if structure == "lowrank" else {}))
    la.fit(loader(X, y))
    return la


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("structure", ["full", "kron", "lowrank"])
def test_top_eigenvectors_are_the_dense_curvature_top_eigenpairs(kind, structure):
    la = _fitted(kind, structure)
    s = la.structure
    H = s.dense_precision(torch.tensor(1.0, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    lam, U = s.curvature_top_eigenvectors(K)
    assert lam.shape == (K,) and U.shape == (la.n_params, K)
    assert bool((lam[:-1] >= lam[1:]).all())
    torch.testing.assert_close(lam, torch.linalg.eigvalsh(H).flip(0)[:K], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(U.T @ U, torch.eye(K, dtype=U.dtype), rtol=0, atol=1e-8)
    torch.testing.assert_close(H @ U, U * lam, rtol=0, atol=1e-8 * float(lam[0]))


def test_only_diag_offers_no_eigenvectors():
    assert {n for n, c in STRUCTURES.items() if offers_eigenvectors(c)} == {"full", "kron", "lowrank"}
    la = _fitted("mlp", "diag")
    with pytest.raises(ValueError, match=r"hessian_structure='diag' offers no eigenvectors.*\['full', 'kron', 'lowrank'\]"):
        la.structure.curvature_top_eigenvectors(K)


@pytest.mark.parametrize("prior", ["scalar", "layerwise", "diagonal"])
def test_lowrank_square_norm_is_the_dense_quadratic_form(prior):
    la = _fitted("mlp", "lowrank")
    n = {"scalar": 1, "layerwise": la.n_layers, "diagonal": la.n_params}[prior]
    c, p = torch.tensor(1.7, dtype=torch.float64), torch.linspace(0.1, 2.0, n, dtype=torch.float64)
    v = torch.randn(la.n_params, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    dense = v @ la.structure.dense_precision(c, p) @ v
    torch.testing.assert_close(la.structure.square_norm(v, c, p), dense, rtol=1e-12, atol=0)
