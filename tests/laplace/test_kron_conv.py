"""KFAC conventions of layers with weight sharing (``kfac_approx``: expand / reduce / backpack).

References (float64): the factors from their definitions (``F.unfold`` patches and autograd output
gradients), curvlinops' ``KFACLinearOperator(kfac_approx=...)`` as a dense matrix, and
laplace-torch's log marginal likelihood with its default backend (curvlinops, expand), with
``asdl_fisher_kwargs={"kfac_approx": "reduce"}`` and with ``BackPackGGN`` (BackPack's KFLR).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from laplace_refs import cnn, data, loader
from torch import nn

from laplace_lab.laplace import Laplace, compat
from laplace_lab.laplace.options import KfacApprox
from laplace_lab.laplace.spec import LaplaceSpec

APPROXES = KfacApprox.values()


def lenet(seed=0):
    """LeNet-like on 16x16 inputs: conv1 -> pool (the chain's pooled path), conv2 (its 2x2
    space-to-depth path) -> pool, two linear layers."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 3, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(3, 4, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def lenet_data(n=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 16, 16, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _fit(model, X, y, approx, batch_size=4, **kw):
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                 structure_options={"kfac_approx": approx}, **kw)
    la.fit(loader(X, y, batch_size=batch_size))
    return la


def _dense(la):
    return la.structure.dense_precision(torch.ones((), dtype=torch.float64), torch.zeros(1, dtype=torch.float64))


def _definition_factors(model, X, y, approx):
    """``{conv module: (G, A)}`` of the EF from the definitions: patches by ``F.unfold``, per-sample
    output gradients of the summed cross-entropy by autograd (the samples do not interact)."""
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    inputs, outputs = {}, {}

    def hook(m, args, out):
        inputs[m] = args[0].detach()
        out.retain_grad()
        outputs[m] = out

    handles = [m.register_forward_hook(hook) for m in convs]
    F.cross_entropy(model(X), y, reduction="sum").backward()
    for h in handles:
        h.remove()
    model.zero_grad()
    out = {}
    for m in convs:
        x = F.unfold(inputs[m], m.kernel_size, m.dilation, m.padding, m.stride)  # [N, D, S]
        g = outputs[m].grad.flatten(2)  # [N, C_out, S]
        N, _, S = x.shape
        if approx == "expand":
            A = torch.einsum("nis,njs->ij", x, x) / (N * S)
            G = torch.einsum("nis,njs->ij", g, g)
        else:
            gs = g.sum(-1)
            G = gs.T @ gs
            A = (x.mean(-1).T @ x.mean(-1) / N) if approx == "reduce" else torch.einsum("nis,njs->ij", x, x) / N
        out[m] = (G, A)
    return out


@pytest.mark.parametrize("approx", APPROXES)
@pytest.mark.parametrize("backend", ["auto", "capture"])
@pytest.mark.parametrize("kind", ["cnn", "lenet"])
def test_conv_factors_match_their_definition(approx, backend, kind):
    """EF factors of every Conv2d (padding, stride, pooled and space-to-depth chain paths) over
    uneven batches equal the definition of the convention; Linear factors do not depend on it."""
    model = cnn() if kind == "cnn" else lenet()
    X, y = data("cnn", "classification", n=10) if kind == "cnn" else lenet_data()
    la = _fit(model, X, y, approx, curvature="ef", backend=backend)
    ref = _definition_factors(model, X, y, approx)
    expand = _fit(model, X, y, "expand", curvature="ef", backend=backend).structure.factors
    i = 0
    for m in model:
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        G, A = la.structure.factors[i]
        if isinstance(m, nn.Conv2d):
            torch.testing.assert_close(G, ref[m][0], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(A, ref[m][1], rtol=1e-10, atol=1e-12)
        else:
            torch.testing.assert_close(G, expand[i][0], rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(A, expand[i][1], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(la.structure.factors[i + 1][0], G)  # the bias block shares G
        i += 2


@pytest.mark.parametrize("approx", ["expand", "reduce"])
@pytest.mark.parametrize("curv", ["ggn", "ef"])
def test_kron_matches_curvlinops_kfac_approx(approx, curv):
    curvlinops = pytest.importorskip("curvlinops")
    model = lenet()
    X, y = lenet_data()
    la = _fit(model, X, y, approx, curvature=curv)
    ft = {"ggn": curvlinops.FisherType.TYPE2, "ef": curvlinops.FisherType.EMPIRICAL}[curv]
    op = curvlinops.KFACLinearOperator(model, nn.CrossEntropyLoss(reduction="sum"), list(model.parameters()),
                                       [(X, y)], fisher_type=ft, separate_weight_and_bias=True,
                                       check_deterministic=False, kfac_approx=approx)
    ref = torch.as_tensor(op @ torch.eye(la.n_params, dtype=torch.float64))
    torch.testing.assert_close(_dense(la), ref, rtol=1e-9, atol=1e-11)


def test_linear_with_weight_sharing_reduce_matches_curvlinops_and_backpack_raises():
    curvlinops = pytest.importorskip("curvlinops")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Flatten(), nn.Linear(20, 2)).double()
    X, y = torch.randn(7, 5, 3, dtype=torch.float64), torch.randn(7, 2, dtype=torch.float64)
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron",
                 structure_options={"kfac_approx": "reduce"})
    la.fit(loader(X, y, batch_size=3))
    op = curvlinops.KFACLinearOperator(model, nn.MSELoss(reduction="sum"), list(model.parameters()), [(X, y)],
                                       fisher_type=curvlinops.FisherType.TYPE2, separate_weight_and_bias=True,
                                       check_deterministic=False, kfac_approx="reduce")
    ref = torch.as_tensor(op @ torch.eye(la.n_params, dtype=torch.float64))
    torch.testing.assert_close(2 * _dense(la), ref, rtol=1e-9, atol=1e-11)  # MSELoss: twice the unit-noise NLL
    bp = Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron",
                 structure_options={"kfac_approx": "backpack"})
    with pytest.raises(ValueError, match="kfac_approx='backpack'.*Allowed for it: 'expand', 'reduce'"):
        bp.fit(loader(X, y))


def _peer(model, X, y, **kw):
    laplace_torch = pytest.importorskip("laplace")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        la = laplace_torch.Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                                   **kw)
        la.fit(loader(X, y, batch_size=4))
    return la.log_marginal_likelihood()


@pytest.mark.parametrize("convention", ["default", "reduce", "backpack"])
@pytest.mark.parametrize("backend", ["auto", "capture"])
@pytest.mark.parametrize("prior", ["scalar", "layerwise"])
def test_kron_marglik_matches_laplace_torch(convention, backend, prior):
    """All-weights KFAC on a LeNet-like net: the same log marglik as laplace-torch 0.3 with its
    default backend (CurvlinopsGGN, expand), with ``asdl_fisher_kwargs={"kfac_approx": "reduce"}``
    and with ``backend=BackPackGGN``, given the same laplace-torch keywords (``compat`` marker)."""
    pytest.importorskip("laplace")
    from laplace.curvature import BackPackGGN

    X, y = lenet_data()
    pp = torch.linspace(0.5, 2.0, 8, dtype=torch.float64) if prior == "layerwise" else 1.3
    ours_kw, peer_kw = {}, {}
    if convention == "reduce":
        ours_kw = peer_kw = {"asdl_fisher_kwargs": {"kfac_approx": "reduce"}}
    elif convention == "backpack":
        ours_kw, peer_kw = {"backend": compat.BackPackGGN}, {"backend": BackPackGGN}
    if backend == "capture":  # the collection backend by name; the convention as a structure option
        approx = {"default": "expand"}.get(convention, convention)
        ours_kw = {"backend": "capture", "structure_options": {"kfac_approx": approx}}
    ours = compat.Engine(lenet(), "classification", subset_of_weights="all", hessian_structure="kron",
                         prior_precision=pp, **ours_kw)
    ours.fit(loader(X, y, batch_size=4))
    theirs = _peer(lenet(), X, y, prior_precision=pp, **peer_kw)  # BackPack extends its model: a fresh copy
    torch.testing.assert_close(ours.log_marginal_likelihood(), theirs.to(torch.float64), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("convention", ["default", "reduce", "backpack"])
def test_kron_factors_equal_laplace_torch_factors(convention):
    """Each parameter tensor's un-decomposed factors (``[G, A]`` of a weight, ``[G]`` of a bias)
    equal laplace-torch's ``H_facs`` over uneven batches."""
    laplace_torch = pytest.importorskip("laplace")
    from laplace.curvature import BackPackGGN

    X, y = lenet_data()
    kw = {"reduce": {"asdl_fisher_kwargs": {"kfac_approx": "reduce"}}}.get(convention, {})
    ours = compat.Engine(lenet(), "classification", subset_of_weights="all", hessian_structure="kron",
                         **(kw | ({"backend": compat.BackPackGGN} if convention == "backpack" else {})))
    ours.fit(loader(X, y, batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = laplace_torch.Laplace(lenet(), "classification", subset_of_weights="all", hessian_structure="kron",
                                       **(kw | ({"backend": BackPackGGN} if convention == "backpack" else {})))
        theirs.fit(loader(X, y, batch_size=4))
    assert len(ours.structure.factors) == len(theirs.H_facs.kfacs) == 8
    for mine, peer in zip(ours.structure.factors, theirs.H_facs.kfacs):
        assert len(mine) == len(peer)
        for a, b in zip(mine, peer):
            torch.testing.assert_close(a, b.to(torch.float64), rtol=1e-10, atol=1e-12)


def test_conventions_differ_on_convolutions():
    """The three conventions are different curvatures on a CNN (the tests above are not vacuous)."""
    X, y = lenet_data()
    lml = [_fit(lenet(), X, y, a).log_marginal_likelihood().item() for a in APPROXES]
    assert min(abs(a - b) for i, a in enumerate(lml) for b in lml[i + 1:]) > 0.1


def test_kfac_approx_is_validated_before_any_work():
    model = lenet()
    allowed = r"\['expand', 'reduce', 'backpack'\]"
    with pytest.raises(ValueError, match=f"kfac_approx='sum' is not supported; allowed: {allowed}"):
        Laplace(model, "classification", hessian_structure="kron", structure_options={"kfac_approx": "sum"})
    with pytest.raises(ValueError, match="kfac_approx.*allowed: \\[\\]"):
        Laplace(model, "classification", hessian_structure="diag", structure_options={"kfac_approx": "reduce"})
    with pytest.raises(ValueError, match="asdl_fisher_kwargs.*only 'kfac_approx'.*'mc_samples'"):
        compat.Engine(model, "classification", hessian_structure="kron", asdl_fisher_kwargs={"mc_samples": 2})
    with pytest.raises(ValueError, match=f"curvature.kfac_approx='Expand' is not supported; allowed: {allowed}"):
        LaplaceSpec(hessian_structure="kron", options={"kfac_approx": "Expand"},
                    keys={"kfac_approx": "curvature.kfac_approx"}).validate()
    LaplaceSpec(hessian_structure="kron", options={"kfac_approx": "reduce"}).validate()


def test_marker_convention_applies_to_kron_only_and_explicit_option_wins():
    model = lenet()
    la = compat.Engine(model, "classification", subset_of_weights="all", hessian_structure="kron",
                       backend=compat.BackPackGGN)
    assert la.structure.kfac_approx == "backpack"
    la = compat.Engine(model, "classification", subset_of_weights="all", hessian_structure="kron",
                       backend=compat.BackPackGGN, structure_options={"kfac_approx": "expand"})
    assert la.structure.kfac_approx == "expand"
    assert compat.Engine(model, "classification", subset_of_weights="all", hessian_structure="kron",
                         backend=compat.CurvlinopsGGN).structure.kfac_approx == "expand"
    compat.Engine(model, "classification", subset_of_weights="all", hessian_structure="diag", backend=compat.BackPackGGN)


def test_state_dict_keeps_the_convention():
    X, y = lenet_data()
    la = _fit(lenet(), X, y, "reduce")
    sd = la.state_dict()
    assert sd["structure.kfac_approx"] == "reduce"
    other = Laplace(lenet(), "classification", subset_of_weights="all", hessian_structure="kron")
    with pytest.raises(ValueError, match="fitted with kfac_approx='reduce'"):
        other.load_state_dict(sd)
    same = Laplace(lenet(), "classification", subset_of_weights="all", hessian_structure="kron",
                   structure_options={"kfac_approx": "reduce"})
    same.load_state_dict(sd)
    torch.testing.assert_close(same.log_marginal_likelihood(), la.log_marginal_likelihood())
