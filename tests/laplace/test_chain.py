"""The batched sequential backward (``chain.Chain``) against the autograd (``Capture``) path and
dense float64 references; its compressed max-pool gradients against the dense kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from laplace_refs import dense_curvature, loader
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.capture import Call
from laplace_lab.laplace.chain import (
    Chain,
    _conv_backward_s2d,
    _conv_pool_s2d,
    _s2d_ok,
    _s2d_perm,
    _slot_onehot,
    _to_blocks,
)
from laplace_lab.laplace.modules import _conv_psg_sq, _conv_psg_sq_pooled, kfac_factors


def lenet_small(d_out=3, seed=0, inplace=False):
    """LeNet's pattern: conv -> ReLU -> 2x2 max-pool (twice) -> linear layers (on 14 x 14 inputs;
    conv2 takes the space-to-depth backward into pool1's compressed gradients)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(inplace=inplace), nn.MaxPool2d(2),
        nn.Conv2d(3, 4, 3), nn.ReLU(inplace=inplace), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 2 * 2, 5), nn.ReLU(inplace=inplace), nn.Linear(5, d_out),
    ).double()


def s2d_cnn(d_out=3, seed=0):
    """Space-to-depth conv backward followed by an activation (depth-to-space) and by a pool."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Conv2d(2, 3, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 2 * 2, d_out),
    ).double()


def odd_cnn(d_out=3, seed=0):
    """Strided / padded / dilated convs, overlapping and ceil-mode pools, other activations."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, stride=2, padding=1), nn.GELU(), nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(3, 4, (2, 3), padding=(1, 0), dilation=(1, 2)), nn.Sigmoid(), nn.Dropout(0.3),
        nn.MaxPool2d(2, ceil_mode=True), nn.Identity(),
        nn.Sequential(nn.Flatten(), nn.Linear(4 * 3 * 1, 6), nn.SiLU()), nn.LeakyReLU(0.1),
        nn.Linear(6, 5), nn.ELU(), nn.Tanh(), nn.Linear(5, d_out),
    ).double()


def images(n, c, h, w, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g, dtype=torch.float64)


def targets(lik, n, d_out, seed=2):
    g = torch.Generator().manual_seed(seed)
    if lik == "classification":
        return torch.randint(0, d_out, (n,), generator=g)
    return torch.randn(n, d_out, generator=g, dtype=torch.float64)


def fit(model, X, y, use_chain, batch_size=5, subset="all", **kw):
    la = Laplace(model, kw.pop("likelihood", "classification"), subset_of_weights=subset, seed=3,
                 backend="chain" if use_chain else "capture", **kw)
    la.fit(loader(X, y, batch_size))
    assert (la.chain is not None) == use_chain
    return la


def curvature_of(la):
    s = la.structure
    if s.name == "kron":
        return s.dense_precision(torch.ones((), dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
    return la.H


CASES = [("lenet", (1, 14, 14)), ("odd", (2, 17, 21)), ("s2d", (1, 12, 12))]


# last-layer fits: only the chain's forward differs, so MC-Fisher and the s2d net add nothing
CHAIN_CASES = [(kind, shape, structure, curv, lik, subset)
               for kind, shape in CASES for structure in ("kron", "diag", "full")
               for curv in ("ggn", "ef", "mc_fisher") for lik in ("classification", "regression")
               for subset in ("all", "last_layer")
               if not (subset == "last_layer" and (curv == "mc_fisher" or kind == "s2d"))]


@pytest.mark.parametrize("kind,shape,structure,curv,lik,subset", CHAIN_CASES)
def test_chain_equals_autograd_path(kind, shape, structure, curv, lik, subset):
    make = {"lenet": lenet_small, "odd": odd_cnn, "s2d": s2d_cnn}[kind]
    X, y = images(11, *shape), targets(lik, 11, 3)
    kw = dict(hessian_structure=structure, curvature=curv, likelihood=lik, subset=subset)
    a = fit(make(), X, y, False, **kw)
    b = fit(make(), X, y, True, **kw)
    torch.testing.assert_close(curvature_of(b), curvature_of(a), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(b.log_marginal_likelihood(), a.log_marginal_likelihood(), rtol=1e-10, atol=0)


@pytest.mark.parametrize("structure", ["full", "diag"])
def test_chain_matches_dense_reference(structure):
    model = lenet_small()
    X, y = images(9, 1, 14, 14), targets("classification", 9, 3)
    la = fit(model, X, y, True, batch_size=4, hessian_structure=structure)
    ref = dense_curvature(model, la, X, y, "ggn", "classification")
    torch.testing.assert_close(la.H, ref if structure == "full" else ref.diagonal(), rtol=1e-9, atol=1e-11)


def test_chain_inplace_relu_and_frozen_first_layer():
    X, y = images(8, 1, 14, 14), targets("classification", 8, 3)
    models = [lenet_small(inplace=True), lenet_small(inplace=False)]
    for m in models:
        m[0].weight.requires_grad_(False)  # the first entry is conv1's bias only
    ref = fit(models[1], X, y, False, hessian_structure="diag")
    for m, use in ((models[0], True), (models[1], True)):
        la = fit(m, X, y, use, hessian_structure="diag")
        torch.testing.assert_close(la.H, ref.H, rtol=1e-10, atol=1e-12)
    models[1][0].requires_grad_(False)  # conv1 frozen: the chain starts at conv2
    a = fit(models[1], X, y, False, hessian_structure="kron")
    b = fit(models[1], X, y, True, hessian_structure="kron")
    torch.testing.assert_close(curvature_of(b), curvature_of(a), rtol=1e-10, atol=1e-12)


def test_chain_sees_weights_changed_through_data():
    """Weights changed between fits through ``.data`` (which leaves the version counter as it is)
    give the new weights' curvature: the convs' blocked weights live for one pass only."""
    X, y = images(8, 1, 14, 14), targets("classification", 8, 3)
    model = lenet_small()
    fit(model, X, y, True, hessian_structure="diag")
    g = torch.Generator().manual_seed(7)
    for conv in (model[0], model[3]):
        conv.weight.data.copy_(torch.randn(conv.weight.shape, generator=g, dtype=torch.float64))
    ref = fit(model, X, y, False, hessian_structure="diag")
    la = fit(model, X, y, True, hessian_structure="diag")
    torch.testing.assert_close(la.H, ref.H, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(la.loss, ref.loss, rtol=1e-12, atol=0)


def test_chain_rejects_unsupported_models():
    conv = nn.Conv2d(1, 2, 3)
    assert Chain.build(nn.Sequential(conv, nn.BatchNorm2d(2)), [conv]) is None  # module with params
    lin = nn.Linear(3, 2)
    assert Chain.build(nn.Sequential(lin, nn.Softmax(-1)), [lin]) is None  # not elementwise

    class Custom(nn.Sequential):
        def forward(self, x):
            return super().forward(x) * 2

    assert Chain.build(Custom(lin), [lin]) is None
    m = nn.Sequential(lin, nn.ReLU())
    assert Chain.build(m, [lin]) is not None
    h = m[1].register_forward_hook(lambda *a: None)
    assert Chain.build(m, [lin]) is None
    h.remove()
    assert Chain.build(nn.Sequential(lin, nn.ReLU(), lin), [lin]) is None  # module used twice
    assert Chain.build(nn.Sequential(nn.Dropout(0.5).train(), lin), [lin]) is None


@pytest.mark.parametrize("k,hw", [(2, (8, 8)), (2, (9, 7)), (3, (9, 12)), ((2, 3), (6, 9)), (1, (4, 5))])
def test_fast_max_pool_matches_max_pool2d_with_ties(k, hw):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (3, 2, *hw), generator=g).double()  # many ties
    pool = nn.MaxPool2d(k)
    ref, ref_idx = F.max_pool2d(x, k, return_indices=True)
    out, idx = Chain.max_pool(pool, x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert torch.equal(idx, ref_idx)
    if k == 2 and hw[0] % 2 == 0 and hw[1] % 2 == 0:
        oh = _slot_onehot(idx.flatten(2), hw[1], torch.float64)  # [N, C, 4, P]
        slot = (idx // hw[1] % 2) * 2 + idx % 2
        assert torch.equal(oh, F.one_hot(slot.flatten(2), 4).double().transpose(2, 3))


def _pooled_call(seed=0, K=4):
    torch.manual_seed(seed)
    m = nn.Conv2d(2, 3, 3, padding=1).double()
    a = torch.randn(5, 2, 8, 6, dtype=torch.float64)
    out = m(a).detach()
    _, idx = F.max_pool2d(out, 2, return_indices=True)
    v = torch.randn(5, K, 3, 4 * 3, dtype=torch.float64)
    c = Call((a,), {}, out)
    c.pooled = (v, idx.flatten(2))
    return m, a, c


def test_pooled_call_materialises_dense_grad():
    m, a, c = _pooled_call()
    v, idx = c.pooled
    dense = torch.zeros(5, 4, 3, 48, dtype=torch.float64)
    for n in range(5):
        for ch in range(3):
            dense[n, :, ch, idx[n, ch]] = v[n, :, ch]
    torch.testing.assert_close(c.grad, dense.view(5, 4, 3, 8, 6).transpose(0, 1), rtol=0, atol=0)
    assert len(c.grads) == 4


def test_pooled_kernels_match_dense_kernels():
    m, a, c = _pooled_call()
    v, idx = c.pooled
    d = _conv_psg_sq_pooled(m, ["weight", "bias"], a, v, idx)
    A, G, rows = kfac_factors(m, [c], "expand")  # from the compressed form
    dense = c.grad  # materialised
    ref = _conv_psg_sq(m, ["weight", "bias"], a, dense)
    torch.testing.assert_close(d["weight"], ref["weight"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d["bias"], ref["bias"], rtol=1e-12, atol=1e-12)
    g = dense.flatten(3)  # [K, N, C, S]
    torch.testing.assert_close(G, torch.einsum("kncs,knds->cd", g, g), rtol=1e-12, atol=1e-12)
    c2 = Call((a,), {}, c.output)
    c2.grads = list(dense.unbind(0))
    A2, G2, rows2 = kfac_factors(m, [c2], "expand")
    torch.testing.assert_close(A, A2, rtol=0, atol=0)
    torch.testing.assert_close(G, G2, rtol=1e-12, atol=1e-12)
    assert rows == rows2


@pytest.mark.parametrize("cin,cout,k,hw", [(6, 16, 5, (8, 8)), (1, 3, 3, (4, 6)), (5, 2, 1, (2, 4)), (3, 7, 7, (6, 2))])
def test_space_to_depth_conv_backward(cin, cout, k, hw):
    torch.manual_seed(0)
    m = nn.Conv2d(cin, cout, k).double()
    N, K = 3, 2
    x_shape = (N, cin, hw[0] + k - 1, hw[1] + k - 1)
    assert _s2d_ok(m, x_shape)
    g = torch.randn(N, K, cout, *hw, dtype=torch.float64)
    ref = F.conv_transpose2d(g.reshape(N * K, cout, *hw), m.weight).view(N, K, cin, *x_shape[2:])
    g_s2d = g.view(N, K, cout, hw[0] // 2, 2, hw[1] // 2, 2).permute(0, 1, 2, 4, 6, 3, 5).reshape(N, K, cout, 4, -1)
    out, perm = _conv_backward_s2d(m, x_shape, g_s2d, K, N, keep_order=False)
    assert perm is None
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    out, in_hw = _conv_backward_s2d(m, x_shape, g_s2d, K, N, keep_order=True)
    assert in_hw == x_shape[2:]
    perm = _s2d_perm(*in_hw, "cpu")
    torch.testing.assert_close(out, ref.flatten(3)[..., perm], rtol=1e-12, atol=1e-12)
    assert torch.equal(perm.sort().values, torch.arange(x_shape[2] * x_shape[3]))
    idx = torch.randint(0, 100, (N, cin, x_shape[2] * x_shape[3]))
    assert torch.equal(_to_blocks(idx, *in_hw), idx[..., perm])
    c = Call((torch.zeros(x_shape, dtype=torch.float64),), {}, torch.zeros(N, cout, *hw, dtype=torch.float64))
    c.s2d = g_s2d.reshape(N, K, cout, -1)
    torch.testing.assert_close(c.grad, g.transpose(0, 1), rtol=0, atol=0)


@pytest.mark.parametrize("cin,cout,k,hw", [(1, 6, 5, (28, 28)), (3, 4, 3, (8, 10)), (2, 5, 1, (4, 2))])
def test_space_to_depth_conv_and_pool_forward(cin, cout, k, hw):
    g = torch.Generator().manual_seed(0)
    m = nn.Conv2d(cin, cout, k).double()
    with torch.no_grad():  # integer weights and inputs: many tied maxima
        m.weight.copy_(torch.randint(-1, 2, m.weight.shape, generator=g))
        m.bias.copy_(torch.randint(-1, 2, m.bias.shape, generator=g))
    x = torch.randint(-1, 2, (3, cin, *hw), generator=g).double()
    z_ref = m(x).detach()
    ref, ref_idx = F.max_pool2d(z_ref, 2, return_indices=True)
    z, pooled, idx = _conv_pool_s2d(m, x)
    torch.testing.assert_close(z(), z_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(pooled, ref, rtol=0, atol=1e-12)
    assert torch.equal(idx, ref_idx)
