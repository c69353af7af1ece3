"""FusedCurvature: curvature accumulated from training steps equals ``Laplace.fit`` over the same
batches when the weights do not move (float64, 1e-10)."""

from __future__ import annotations

import pytest
import torch
from laplace_refs import cnn, data, mlp
from torch import nn

from laplace_lab.laplace import Laplace
from laplace_lab.laplace.fused import FusedCurvature


def _batches(X, y, bs):
    return [(X[i:i + bs], y[i:i + bs]) for i in range(0, len(X), bs)]


def _train_epoch_fused(model, la, batches, *, mean_loss=True, prior=1e-2, step=True):
    """An ordinary training epoch (batch-mean NLL + L2 prior, SGD with lr=0) with the fused hooks."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    fused = FusedCurvature(la)
    fused.begin()
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        with fused.batch(y, nll_scale=1.0 / len(y) if mean_loss else 1.0) as rec:
            f = model(x)
            rec.output(f)
        if la.likelihood == "classification":
            nll = nn.functional.cross_entropy(f, y, reduction="mean" if mean_loss else "sum")
        else:
            nll = 0.5 * (f - y).square().sum() / (len(y) if mean_loss else 1.0)
        loss = nll + prior * sum(p.square().sum() for p in model.parameters())
        loss.backward()
        if step:
            opt.step()
        if i % 2 == 0:
            fused.flush()  # else lazily at the next batch / at end()
    fused.end()
    return la


def _dense(la):
    return la.structure.dense_precision(torch.ones((), dtype=torch.float64), torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize("structure", ["kron", "diag"])
@pytest.mark.parametrize("kind,lik", [("mlp", "classification"), ("mlp", "regression"), ("cnn", "classification")])
@pytest.mark.parametrize("curv", ["ef", "mc_fisher"])
def test_fused_equals_fit_over_same_batches(kind, lik, structure, curv):
    d_out = 3 if lik == "classification" else 2
    model = (mlp(d_out=d_out) if kind == "mlp" else cnn(d_out=d_out))
    model.train()
    X, y = data(kind, lik, n=20, d_out=d_out)
    batches = _batches(X, y, 6)  # uneven last batch
    kw = dict(subset_of_weights="all", hessian_structure=structure, curvature=curv, prior_precision=0.7,
              n_mc_samples=2)
    ref = Laplace(model, lik, seed=3, **kw)
    ref.fit(batches)
    la = _train_epoch_fused(model, Laplace(model, lik, seed=3, **kw), batches)
    assert model.training  # fused mode leaves the train/eval mode alone
    assert la.n_data == ref.n_data == 20
    torch.testing.assert_close(la.loss, ref.loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_dense(la), _dense(ref), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood(), rtol=1e-10, atol=0)


def test_fused_ef_with_summed_loss_and_inplace_relu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=True), nn.Linear(5, 4), nn.ReLU(),
                          nn.Linear(4, 3)).double()
    X, y = data("mlp", "classification", n=16)
    batches = _batches(X, y, 5)
    kw = dict(subset_of_weights="all", hessian_structure="kron", curvature="ef")
    ref = Laplace(model, "classification", **kw)
    ref.fit(batches)
    la = _train_epoch_fused(model, Laplace(model, "classification", **kw), batches, mean_loss=False)
    torch.testing.assert_close(_dense(la), _dense(ref), rtol=1e-10, atol=1e-12)


def test_fused_with_a_moving_optimizer_runs_and_uses_final_weights():
    model = mlp()
    X, y = data("mlp", "classification", n=20)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron", curvature="ef")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fused = FusedCurvature(la)
    fused.begin()
    for x, yy in _batches(X, y, 5):
        opt.zero_grad()
        with fused.batch(yy, 1 / len(yy)) as rec:
            f = model(x)
            rec.output(f)
        nn.functional.cross_entropy(f, yy).backward()
        opt.step()
    fused.end()
    final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(la.mean, final)
    assert torch.isfinite(la.log_marginal_likelihood())


@pytest.mark.parametrize("kw, option", [
    ({"curvature": "ggn"}, "curvature"),
    ({"hessian_structure": "full"}, "hessian_structure"),
    ({"subset_of_weights": "last_layer"}, "subset_of_weights"),
])
def test_fused_rejects_unsupported_options(kw, option):
    base = {"subset_of_weights": "all", "hessian_structure": "kron", "curvature": "ef"} | kw
    with pytest.raises(ValueError, match=option):
        FusedCurvature(Laplace(mlp(), "classification", **base))


def test_fused_flush_before_backward_raises():
    model = mlp()
    X, y = data("mlp", "classification", n=6)
    fused = FusedCurvature(Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag",
                                   curvature="ef"))
    fused.begin()
    with fused.batch(y, 1 / 6) as rec:
        rec.output(model(X))
    with pytest.raises(RuntimeError, match="back-propagated"):
        fused.flush()


@pytest.mark.parametrize("curv", ["ef", "mc_fisher"])
def test_flushed_batches_release_their_tensors(curv):
    """EF's gradient hooks form a cycle (output -> hook -> Call -> output) that Python's garbage
    collector cannot see through (the hook is held in C++): flush must break it, or every batch
    leaks its layer outputs and gradients."""
    import gc
    import weakref

    model = mlp()
    X, y = data("mlp", "classification", n=12)
    fused = FusedCurvature(Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                                   curvature=curv))
    fused.begin()
    refs = []
    for x, yy in _batches(X, y, 6):
        with fused.batch(yy, 1 / len(yy)) as rec:
            f = model(x)
            rec.output(f)
        refs.append(weakref.ref(f))
        nn.functional.cross_entropy(f, yy).backward()
        fused.flush()
        del f, rec
    gc.collect()
    assert all(r() is None for r in refs)
    fused.end()


@pytest.mark.parametrize("approx", ["reduce", "backpack"])
@pytest.mark.parametrize("curv", ["ef", "mc_fisher"])
def test_fused_kron_conv_convention_equals_fit(approx, curv):
    """The fused training-step hooks use the structure's ``kfac_approx`` as ``Laplace.fit`` does."""
    model = cnn()
    model.train()
    X, y = data("cnn", "classification", n=20)
    batches = _batches(X, y, 6)
    kw = dict(subset_of_weights="all", hessian_structure="kron", curvature=curv, n_mc_samples=2,
              structure_options={"kfac_approx": approx})
    ref = Laplace(model, "classification", seed=3, **kw)
    ref.fit(batches)
    la = _train_epoch_fused(model, Laplace(model, "classification", seed=3, **kw), batches)
    expand = Laplace(model, "classification", seed=3, **(kw | {"structure_options": {}}))
    expand.fit(batches)
    torch.testing.assert_close(_dense(la), _dense(ref), rtol=1e-10, atol=1e-12)
    assert not torch.allclose(_dense(la), _dense(expand))


class _Shared(nn.Module):
    """A Linear called twice per forward (two calls of one module) and a LayerNorm (generic kernel)."""

    def __init__(self):
        super().__init__()
        self.inp, self.shared, self.norm, self.out = nn.Linear(3, 4), nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 3)

    def forward(self, x):
        h = torch.tanh(self.shared(torch.tanh(self.inp(x))))
        return self.out(self.norm(torch.tanh(self.shared(h))))


@pytest.mark.parametrize("structure", ["kron", "diag"])
@pytest.mark.parametrize("curv", ["ef", "mc_fisher"])
def test_chunked_accumulation_equals_batch_by_batch_and_fit(structure, curv):
    """Batches accumulated together (concatenated Linear / Conv2d calls, other modules batch by
    batch, uneven batch sizes, a module called twice) give the curvature of ``Laplace.fit``."""
    torch.manual_seed(0)
    model = _Shared().double()
    X, y = data("mlp", "classification", n=23)
    batches = _batches(X, y, 5)
    kw = dict(subset_of_weights="all", hessian_structure=structure, curvature=curv, n_mc_samples=2)
    ref = Laplace(model, "classification", seed=3, **kw)
    ref.fit(batches)
    dense = []
    for chunk in (1, 12, 10**9):
        la = Laplace(model, "classification", seed=3, **kw)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        fused = FusedCurvature(la, chunk_size=chunk)
        fused.begin()
        for x, yy in batches:
            opt.zero_grad()
            with fused.batch(yy, nll_scale=1.0 / len(yy)) as rec:
                f = model(x)
                rec.output(f)
            nn.functional.cross_entropy(f, yy).backward()
            fused.flush()
        fused.end()
        dense.append(_dense(la))
        torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood(), rtol=1e-10, atol=0)
    for d in dense:
        torch.testing.assert_close(d, _dense(ref), rtol=1e-10, atol=1e-12)


def test_merge_calls_concatenates_scaled_and_refuses_mismatched_shapes():
    from laplace_lab.laplace.capture import Call
    from laplace_lab.laplace.fused import _merge_calls

    def call(n, t):
        c = Call((torch.ones(n, t, 3),), {}, None)
        c.grads = [torch.ones(n, t, 2), 2 * torch.ones(n, t, 2)]
        return c

    merged = _merge_calls([[call(2, 4)], [call(3, 4)]], [1.0, 0.5])
    assert merged[0].args[0].shape == (5, 4, 3)
    assert [g.shape for g in merged[0].grads] == [(5, 4, 2), (5, 4, 2)]
    torch.testing.assert_close(merged[0].grads[1][2:], torch.ones(3, 4, 2))  # 2 * 0.5
    assert _merge_calls([[call(2, 4)], [call(3, 5)]], [1.0, 1.0]) is None  # sequence lengths differ
    assert _merge_calls([[call(2, 4)], [call(3, 4), call(3, 4)]], [1.0, 1.0]) is None  # call counts differ


def test_grad_hooks_do_not_keep_layer_outputs_alive():
    """Capture(grad_hooks=True) must not form output -> hook -> Call -> output cycles: the C++
    side holds tensor hooks, so Python's collector cannot free such a cycle (a per-batch leak)."""
    import gc
    import weakref

    from laplace_lab.laplace.capture import Capture

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    cap = Capture([model[0], model[2]], grad_hooks=True)
    with cap:
        out = model(torch.randn(5, 3))
    out.square().sum().backward()
    call = cap.records[0].calls[0]
    assert call.grads is not None and call.grads[0].shape == (5, 4)
    refs = [weakref.ref(c.output) for r in cap.records for c in r.calls]
    del cap, call, out
    gc.collect()
    assert all(r() is None for r in refs)
