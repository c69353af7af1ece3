"""Curvature backends (``Laplace(backend=...)``, ``laplace.backends``): every registered backend gives
the same curvature, loss and marglik as ``auto`` on small models; ``backend=`` parsing (collection
backend names, laplace-torch's marker classes and curvature names) and its errors."""

from __future__ import annotations

import pytest
import torch
from laplace_refs import data, dense_curvature, loader, mlp
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.backends import BACKENDS, backend_names
from laplace_lab.laplace.compat import CurvlinopsEF, Engine


def _dense(la):
    one, zero = torch.ones((), dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    return la.structure.dense_precision(one, zero)


def _fit(model, X, y, backend, **kw):
    la = Laplace(model, kw.pop("likelihood", "classification"), subset_of_weights=kw.pop("subset", "all"),
                 backend=backend, seed=3, **kw)
    la.fit(loader(X, y, 4))
    return la


@pytest.mark.parametrize("name", sorted(BACKENDS))
@pytest.mark.parametrize("structure", ["kron", "diag", "full"])
@pytest.mark.parametrize("curvature", ["ggn", "ef", "mc_fisher"])
def test_every_backend_equals_auto(name, structure, curvature):
    X, y = data("mlp", "classification")
    kw = dict(hessian_structure=structure, curvature=curvature)
    ref = _fit(mlp(), X, y, "auto", **kw)
    model = mlp()
    la = _fit(model, X, y, name, **kw)
    torch.testing.assert_close(_dense(la), _dense(ref), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(la.loss, ref.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood(), rtol=1e-10, atol=0)
    if structure == "full" and curvature == "ggn":  # and both against the dense float64 GGN
        torch.testing.assert_close(la.H, dense_curvature(model, la, X, y), rtol=1e-9, atol=1e-11)


def test_auto_is_the_chain_for_sequential_nets_and_capture_otherwise():
    X, y = data("mlp", "classification")
    assert _fit(mlp(), X, y, "auto").chain is not None

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)) + x)

    torch.manual_seed(0)
    model = Residual().double()
    la = _fit(model, X, y, "auto")
    assert la.chain is None
    ref = _fit(model, X, y, "capture")
    torch.testing.assert_close(_dense(la), _dense(ref), rtol=0, atol=0)
    with pytest.raises(ValueError, match="backend='chain' does not support this model"):
        Laplace(model, "classification", subset_of_weights="all", backend="chain").fit(loader(X, y, 4))


def test_backend_keyword_parsing():
    model = mlp()
    assert set(backend_names()) >= {"auto", "chain", "capture", "lanczos"}
    la = Engine(model, "classification", backend=CurvlinopsEF)  # laplace-torch marker: sets the curvature
    assert (la.curvature, la.backend) == ("ef", "auto")
    la = Engine(model, "classification", backend="ef")  # laplace-torch's curvature names still work
    assert (la.curvature, la.backend) == ("ef", "auto")
    with pytest.raises(ValueError, match=r"backend must be one of .*'auto'.*got 'ef'.*laplace_lab.laplace.compat"):
        Laplace(model, "classification", backend="ef")  # the engine itself: its backend names only
    assert Laplace(model, "classification", backend="capture").backend == "capture"
    with pytest.raises(ValueError, match=r"backend must be one of .*'auto'.*got 3"):
        Engine(model, "classification", backend=3)
    with pytest.raises(ValueError, match="backend must be one of"):
        Engine(model, "classification", backend="asdl")
    with pytest.raises(ValueError, match="backend='lanczos'.*self-fitting"):
        Laplace(model, "classification", hessian_structure="kron", backend="lanczos")
    with pytest.raises(ValueError, match="backend='chain' cannot fit hessian_structure='lowrank'"):
        Laplace(model, "classification", subset_of_weights="all", hessian_structure="lowrank", backend="chain")
    assert Laplace(model, "classification", subset_of_weights="all", hessian_structure="lowrank",
                   backend="lanczos").backend == "lanczos"


class _ResidualCNN(nn.Module):
    """Conv + residual + Linear head: the capture backend, both KFAC module kinds, two calls of one conv."""

    def __init__(self, d_out=3):
        super().__init__()
        self.conv, self.conv2 = nn.Conv2d(1, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Linear(3 * 8 * 8, d_out)

    def forward(self, x):
        h = torch.tanh(self.conv(x))
        h = h + torch.tanh(self.conv2(h))
        h = h + torch.tanh(self.conv2(h))  # a second call of the same module
        return self.head(h.flatten(1))


class _DeadBranch(_ResidualCNN):
    """A recorded module whose output does not reach the network output: zero gradients."""

    def __init__(self, d_out=4):
        super().__init__(d_out)
        self.unused = nn.Conv2d(1, 2, 3)

    def forward(self, x):
        self.unused(x)
        return super().forward(x)


class _Branches(nn.Module):
    """Two calls of one Linear, one of them on a learnt constant: that output does not depend on the
    input, so a backward w.r.t. the input would miss its gradient (the batch is not streamed)."""

    def __init__(self, d_out=4):
        super().__init__()
        self.a, self.b = nn.Linear(64, 6), nn.Linear(6, d_out)
        self.const = nn.Parameter(torch.randn(1, 64))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x.flatten(1))) + 0.1 * self.a(self.const))


@pytest.mark.parametrize("structure,options", [("kron", {"kfac_approx": "expand"}), ("kron", {"kfac_approx": "reduce"}),
                                               ("kron", {"kfac_approx": "backpack"}), ("diag", None), ("full", None)])
@pytest.mark.parametrize("curvature", ["ggn", "mc_fisher"])
@pytest.mark.parametrize("model_kind", ["residual_cnn", "dead_branch", "branches"])
def test_streamed_backward_equals_one_backward(monkeypatch, structure, options, curvature, model_kind):
    """The capture backend streams a batch whose output gradients exceed its budget (one backward
    per factor, gradients accumulated by tensor hooks in groups of at most ``STREAM_BUDGET``
    elements; after the first batch, forwards that keep no module outputs): curvature, loss and
    marglik as with one backward of all factors. Structures without ``factor_chunks`` (full), and
    models with an output that does not depend on the input, are not streamed."""
    import laplace_lab.laplace.backends.capture as capture_backend
    from laplace_lab.laplace import capture

    torch.manual_seed(0)
    model = {"residual_cnn": _ResidualCNN, "dead_branch": _DeadBranch, "branches": _Branches}[model_kind](d_out=4).double()
    X, y = torch.randn(10, 1, 8, 8, dtype=torch.float64), torch.randint(0, 4, (10,))
    kw = dict(hessian_structure=structure, curvature=curvature, structure_options=options, n_mc_samples=3)
    ref = _fit(model, X, y, "capture", **kw)
    flushes = []
    stream = capture.Capture.stream

    modes = []

    def spy(self, f, V, source, accumulate, budget):
        modes.append(self.stream_mode)

        def counting(parts, first):
            flushes.append(sum(len(r.calls) for r in parts))
            accumulate(parts, first)
        stream(self, f, V, source, counting, budget)

    monkeypatch.setattr(capture.Capture, "stream", spy)
    monkeypatch.setattr(capture_backend, "OUTPUT_FREE_DEVICES", ("cuda", "cpu"))  # CUDA's path, on the CPU
    monkeypatch.setattr(capture_backend, "FACTOR_BUDGET", 10)
    monkeypatch.setattr(capture_backend, "STREAM_BUDGET", 3 * 64 * 4)  # one conv output of 4 inputs
    la = _fit(model, X, y, "capture", **kw)
    streamed = structure != "full" and model_kind != "branches"
    assert bool(flushes) == streamed
    if streamed:  # several groups per factor: 3 batches x 3 factors x (> 1 group); outputs kept only first
        assert len(flushes) > 9 and min(flushes) >= 1
        assert modes == [False, True, True]
    torch.testing.assert_close(_dense(la), _dense(ref), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(la.loss, ref.loss, rtol=1e-14, atol=0)
    torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood(), rtol=1e-12, atol=0)
    assert la.n_data == ref.n_data == 10


def test_streamed_fit_leaves_no_captures_alive(monkeypatch):
    """The hooks of output-free forwards live on the graph: they must not keep a batch's capture (its
    inputs) alive after the fit (a reference cycle through autograd's C++ nodes)."""
    import gc

    import laplace_lab.laplace.backends.capture as capture_backend
    from laplace_lab.laplace import capture

    monkeypatch.setattr(capture_backend, "FACTOR_BUDGET", 10)
    monkeypatch.setattr(capture_backend, "OUTPUT_FREE_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    model = _ResidualCNN(d_out=4).double()
    X, y = torch.randn(12, 1, 8, 8, dtype=torch.float64), torch.randint(0, 4, (12,))
    _fit(model, X, y, "capture", hessian_structure="kron")
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, (capture.Capture, capture.Call))]
