"""Streaming of output factors and the fit batch chosen from the memory budget
(``backends.capture.stream_factors``, ``plan.fit_plan``, ``plan.auto_fit_batch``): the rule on
hand-made numbers, the plan predicting what the backend does, the CUDA rule run on the CPU (its
device lists patched), and the result unchanged by streaming or by the batch (float64)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from laplace_refs import loader
from test_backends import _dense, _ResidualCNN

import laplace_lab.laplace.backends.capture as capture_backend
from laplace_lab.laplace import Laplace, capture, plan, plan_terms
from laplace_lab.laplace.backends.capture import FACTOR_BUDGET, stream_factors
from laplace_lab.laplace.output_factors import n_output_factors
from laplace_lab.laplace.structures import STRUCTURES


def test_stream_factors_rule_on_hand_made_numbers():
    # the CPU (and any device without a budget): the constant rule, whatever the plan says
    assert stream_factors(FACTOR_BUDGET + 1, "cpu", held_fit=1, limit=100)
    assert not stream_factors(FACTOR_BUDGET, "cpu", held_fit=10**15, limit=1)
    assert stream_factors(FACTOR_BUDGET + 1) and not stream_factors(FACTOR_BUDGET)
    # CUDA with a budget: exactly when the fit holding every gradient exceeds the limit
    assert stream_factors(10, "cuda", held_fit=101, limit=100)
    assert not stream_factors(10 * FACTOR_BUDGET, "cuda", held_fit=100, limit=100)
    # CUDA with memory_budget=None (no limit) or no plan: the constant rule
    assert stream_factors(FACTOR_BUDGET + 1, "cuda", held_fit=1, limit=None)
    assert not stream_factors(FACTOR_BUDGET, "cuda", held_fit=None, limit=1)


def _shape(model, X, subset="all"):
    probe = plan.probe_model(model, X)
    return plan.shape_of(model, probe, subset), n_output_factors("classification", "ggn", probe["n_outputs"], 1)


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_fit_plan_streams_on_cuda_exactly_past_the_limit(structure):
    torch.manual_seed(0)
    model = _ResidualCNN(d_out=4).double()
    shape, K = _shape(model, torch.randn(2, 1, 8, 8, dtype=torch.float64))
    cls, N = STRUCTURES[structure], 8192  # K N recorded > N recorded + STREAM_BUDGET: streaming saves
    held = plan.structure_plan(cls, dataclasses.replace(shape, stream=False), N, K)
    streamed = plan.structure_plan(cls, dataclasses.replace(shape, stream=True), N, K)
    assert streamed.fit < held.fit and streamed.stream and not held.stream
    at = plan.fit_plan(cls, shape, N, K, None, "cuda", limit=held.fit)
    over = plan.fit_plan(cls, shape, N, K, None, "cuda", limit=held.fit - 1)
    assert (at.fit, at.stream) == (held.fit, False) and (over.fit, over.stream) == (streamed.fit, True)
    # the CPU, or no limit: the constant rule (these gradients are below FACTOR_BUDGET: held)
    assert K * N * shape.recorded <= FACTOR_BUDGET
    for device, limit in (("cpu", held.fit - 1), ("cuda", None)):
        assert plan.fit_plan(cls, shape, N, K, None, device, limit).fit == held.fit
    # last-layer and structures without factor_chunks never stream
    last, _ = _shape(model, torch.randn(2, 1, 8, 8, dtype=torch.float64), "last_layer")
    assert not plan.fit_plan(cls, last, N, K, None, "cuda", limit=1).stream
    assert not plan.fit_plan(STRUCTURES["full"], shape, N, K, None, "cuda", limit=1).stream


def _held_fit(la, X, batch):
    """The planned fit peak of ``la`` at ``batch`` holding every factor's gradients."""
    memory, _ = plan.laplace_plan(la, X, batch, "cuda", limit=2**62)
    assert not memory.stream
    return memory.fit


def _cuda_rule_on_cpu(monkeypatch):
    """Run the CUDA rule on the CPU: the budget and output-free device lists include it; streaming
    holds one conv output of 4 inputs (so that it saves memory on a small model)."""
    for module in (capture_backend, plan):
        monkeypatch.setattr(module, "BUDGET_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(capture_backend, "OUTPUT_FREE_DEVICES", ("cuda", "cpu"))
    for module in (capture_backend, plan_terms):
        monkeypatch.setattr(module, "STREAM_BUDGET", 3 * 64 * 4)


def _count_streams(monkeypatch) -> list:
    calls = []
    stream = capture.Capture.stream

    def spy(self, *args):
        calls.append(1)
        stream(self, *args)
    monkeypatch.setattr(capture.Capture, "stream", spy)
    return calls


def _data(n=12):
    torch.manual_seed(0)
    model = _ResidualCNN(d_out=4).double()
    return model, torch.randn(n, 1, 8, 8, dtype=torch.float64), torch.randint(0, 4, (n,))


@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_backend_streams_as_the_budget_plan_says_and_the_result_is_the_same(monkeypatch, structure):
    """CUDA's rule (on the CPU): with the limit just below the held fit's planned peak the fit streams
    every batch, at that peak it streams none, even with the constant rule's budget at 10 elements;
    curvature, loss and marglik are those of the unstreamed fit to 1e-12 (float64)."""
    model, X, y = _data(128)  # 2 batches of 64: the output gradients are the largest part of the peak
    kw = dict(subset_of_weights="all", hessian_structure=structure, backend="capture", seed=3)
    ref = Laplace(model, "classification", memory_budget=None, **kw)
    ref.fit(loader(X, y, 64))
    _cuda_rule_on_cpu(monkeypatch)
    monkeypatch.setattr(capture_backend, "FACTOR_BUDGET", 10)
    calls = _count_streams(monkeypatch)
    held = _held_fit(Laplace(model, "classification", **kw), X[:64], 64)
    for limit, streams in ((held, False), (held - 1, True)):
        monkeypatch.setattr(plan, "available_memory", lambda device, limit=limit: limit)
        calls.clear()
        la = Laplace(model, "classification", memory_budget=1.0, **kw)
        la.fit(loader(X, y, 64))
        assert la.factor_streaming is streams and la.memory_plan.stream is streams
        assert la.memory_plan.fit < held if streams else la.memory_plan.fit == held
        assert len(calls) == (2 if streams else 0)
        torch.testing.assert_close(_dense(la), _dense(ref), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(la.loss, ref.loss, rtol=1e-14, atol=0)
        torch.testing.assert_close(la.log_marginal_likelihood(), ref.log_marginal_likelihood(), rtol=1e-12, atol=0)


def test_fit_batch_without_fit_decides_streaming_on_its_first_batch(monkeypatch):
    model, X, y = _data()
    _cuda_rule_on_cpu(monkeypatch)
    calls = _count_streams(monkeypatch)
    monkeypatch.setattr(plan, "available_memory", lambda device: 1)  # nothing held fits: stream
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron", backend="capture")
    la.fit_begin()
    assert la.factor_streaming is None
    la.fit_batch(X[:6], y[:6])
    la.fit_batch(X[6:], y[6:])
    la.fit_end()
    assert la.factor_streaming is True and len(calls) == 2


def test_cpu_keeps_the_constant_rule(monkeypatch):
    """On the CPU the budget decides nothing: ``factor_streaming`` stays ``None`` and a batch over
    ``FACTOR_BUDGET`` streams even with all the memory in the world."""
    model, X, y = _data()
    monkeypatch.setattr(plan, "available_memory", lambda device: 2**60)
    monkeypatch.setattr(capture_backend, "FACTOR_BUDGET", 10)
    calls = _count_streams(monkeypatch)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron", backend="capture")
    la.fit(loader(X, y, 4))
    assert la.factor_streaming is None and la.memory_plan.stream and len(calls) == 3


# ---- the fit batch -----------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["kron", "diag"])
def test_auto_fit_batch_is_the_largest_that_fits_on_cuda(monkeypatch, structure):
    model, X, y = _data(128)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure)
    base = 16  # from 64 on the batch's part is the largest of the peak: the peak grows with the batch
    assert _held_fit(la, X[:base], 4 * base) < _held_fit(la, X[:base], 8 * base)
    limit = (_held_fit(la, X[:base], 4 * base) + _held_fit(la, X[:base], 8 * base)) / 2
    monkeypatch.setattr(plan, "available_memory", lambda device: int(limit / 0.9))
    batch, reason = plan.auto_fit_batch(la, X[:base], base, cap=4096, memory_budget=0.9, device="cuda")
    assert batch == 4 * base, reason
    assert plan.auto_fit_batch(la, X[:base], base, cap=2 * base, device="cuda")[0] == 2 * base  # the cap
    batch, reason = plan.auto_fit_batch(la, X[:base], base, device="cpu")
    assert batch == base and reason.startswith("cpu")
    mc = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure, curvature="mc_fisher")
    batch, reason = plan.auto_fit_batch(mc, X[:base], base, device="cuda")
    assert batch == base and "mc_fisher" in reason
    # the fit at the chosen batch is the fit at the base batch (the curvature sums over the data)
    fits = []
    for b in (base, 4 * base):
        for curvature in ("ggn", "ef"):
            one = Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure,
                          curvature=curvature)
            one.fit(loader(X, y, b))
            fits.append((b, curvature, _dense(one), one.log_marginal_likelihood()))
    for (_, c1, d1, m1), (_, c2, d2, m2) in zip(fits[:2], fits[2:]):
        assert c1 == c2
        torch.testing.assert_close(d2, d1, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(m2, m1, rtol=1e-12, atol=0)


def test_mc_fisher_is_not_batch_invariant():
    """Why ``auto`` keeps ``mc_fisher``'s batch: its sampled labels depend on how the data are cut
    (here with 2 samples per datum, drawn ``[S, N]`` per batch)."""
    model, X, y = _data(16)
    dense = []
    for b in (4, 16):
        la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag",
                     curvature="mc_fisher", n_mc_samples=2, seed=3)
        la.fit(loader(X, y, b))
        dense.append(_dense(la))
    assert not torch.allclose(dense[0], dense[1], rtol=1e-3)
