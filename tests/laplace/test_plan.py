"""The memory plan (``laplace.plan``): early refusal of a fit that cannot fit, the alternatives it
names, the structures' declared state against the tensors they really keep, and the glm
predictive's chunk chosen from the plan (same result as one chunk)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from laplace_lab.laplace import Laplace, plan
from laplace_lab.laplace.plan import MemoryPlanError

GiB = 2**30


@pytest.fixture
def available(monkeypatch):
    """Fix the available memory the plan sees: ``available(n_bytes)``."""

    def set_available(n_bytes: int):
        monkeypatch.setattr(plan, "available_memory", lambda device: n_bytes)

    return set_available


def mlp_6m() -> nn.Sequential:
    """An MLP 784-632-9048-10 with the issue's 6,313,994 parameters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 632), nn.ReLU(), nn.Linear(632, 9048), nn.ReLU(), nn.Linear(9048, 10))


def test_full_laplace_of_6m_mlp_refused_in_under_a_second_before_allocating(available):
    available(16 * GiB)
    model = mlp_6m()
    assert sum(p.numel() for p in model.parameters()) == 6_313_994
    X, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="full")
    start = time.perf_counter()
    with pytest.raises(MemoryPlanError) as err:
        la.fit([(X, y)])
    assert time.perf_counter() - start < 1.0
    assert la.structure._H is None  # nothing allocated: full allocates H on its first batch
    msg = str(err.value)
    assert "hessian_structure='full'" in msg and "6,313,994 parameters" in msg and "TiB" in msg
    # the alternatives that fit, each with its size; full is not among them, kron / diag are
    alts = msg.split("Alternatives that fit:")[1]
    assert "hessian_structure='kron' subset_of_weights='all' (" in alts
    assert "hessian_structure='diag' subset_of_weights='all' (" in alts
    assert "hessian_structure='full'" not in alts
    assert "memory_budget=None" in msg


def test_alternatives_listed_are_exactly_those_under_the_budget(available):
    model = mlp_6m()
    X, y = torch.randn(8, 784), torch.randint(0, 10, (8,))
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="full")
    probe = plan.probe_model(model, X)
    rows = plan.alternatives(model, probe, 8, 9, "ggn")
    sizes = {r.label: r.memory.fit for r in rows}
    limit = sizes["kron/all"] * 1.01  # kron fits, and so does everything smaller
    available(int(limit / 0.9) + 1)
    with pytest.raises(MemoryPlanError) as err:
        la.fit([(X, y)])
    alts = str(err.value).split("Alternatives that fit:")[1]
    for label, size in sizes.items():
        structure, subset = label.split("/")
        named = f"hessian_structure={structure!r} subset_of_weights={subset!r} ({plan.human(size)})" in alts
        assert named == (size <= limit), (label, size, limit)


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, "half", True])
def test_memory_budget_must_be_a_fraction(bad):
    with pytest.raises(ValueError, match="memory_budget must be None"):
        Laplace(nn.Linear(3, 2), "classification", memory_budget=bad)


def test_memory_budget_none_skips_the_check(available):
    available(1)  # nothing fits
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    data = [(torch.randn(10, 4), torch.randint(0, 3, (10,)))]
    with pytest.raises(MemoryPlanError, match="hessian_structure='kron'"):
        Laplace(model, "classification", hessian_structure="kron").fit(data)
    la = Laplace(model, "classification", hessian_structure="kron", memory_budget=None)
    la.fit(data)
    assert la.fitted and la.memory_plan is None


def test_fit_sees_every_batch_of_a_one_shot_iterator():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    data = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(3)]
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag")
    la.fit(iter(data))
    ref = Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag", memory_budget=None)
    ref.fit(data)
    assert la.n_data == 15 and la.memory_plan is not None
    torch.testing.assert_close(la.H, ref.H)


def _kept_bytes(structure) -> int:
    """Bytes of the distinct tensors a fitted structure holds (diag ``h``, full ``H``, kron raw sums
    and eigenbases)."""
    seen: dict[int, torch.Tensor] = {}

    def visit(obj):
        if isinstance(obj, torch.Tensor):
            seen[id(obj)] = obj
        elif isinstance(obj, dict):
            [visit(v) for v in obj.values()]
        elif isinstance(obj, (list, tuple)):
            [visit(v) for v in obj]
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("laplace_lab"):
            [visit(v) for k, v in vars(obj).items() if k not in ("entries", "shapes")]

    visit({k: v for k, v in vars(structure).items() if k not in ("entries", "shapes")})
    return sum(t.numel() * t.element_size() for t in seen.values())


@pytest.mark.parametrize("structure", ["diag", "kron", "full"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_declared_state_is_what_the_structure_keeps(structure, subset):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 7), nn.ReLU(),
                          nn.Linear(7, 4))
    X, y = torch.randn(6, 1, 8, 8), torch.randint(0, 4, (6,))
    la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
    la.fit([(X, y)])
    assert la.memory_plan.state == _kept_bytes(la.structure)
    assert la.memory_plan.fit >= la.memory_plan.state


def _last_layer_diag(n_classes: int, n_train: int = 16):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, n_classes))
    la = Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="diag",
                 curvature="ef", prior_precision=5.0)
    la.fit([(torch.randn(n_train, 20), torch.randint(0, n_classes, (n_train,)))])
    return la


def test_predictive_with_10000_classes_refused_when_one_input_does_not_fit(available):
    la = _last_layer_diag(10_000)
    per_input = plan.laplace_plan(la, torch.randn(1, 20), batch=1)[0].predict_per_input
    assert per_input > 10_000**2 * 4  # at least one [C, C] float32 per test input
    available(int(per_input / 2))
    start = time.perf_counter()
    with pytest.raises(MemoryPlanError, match="per test input") as err:
        la(torch.randn(4, 20))
    assert time.perf_counter() - start < 1.0
    assert "hessian_structure='diag'" in str(err.value) and "10000 outputs" in str(err.value)


def test_predictive_with_10000_classes_takes_its_chunk_from_the_plan(available, monkeypatch):
    from laplace_lab.laplace import predictive

    la = _last_layer_diag(10_000)
    memory = plan.laplace_plan(la, torch.randn(1, 20), batch=1)[0]
    available(int((memory.predict_fixed + 3.5 * memory.predict_per_input) / la.memory_budget))
    seen = []

    def fake_chunk(la, x, *args, **kwargs):  # the chunking alone: no 400 MB per input here
        seen.append(x.shape[0])
        return torch.full((x.shape[0], 10_000), 1e-4)

    monkeypatch.setattr(predictive, "_predict_chunk", fake_chunk)
    out = la(torch.randn(10, 20))  # default chunk_size=256
    assert seen == [3, 3, 3, 1] and out.shape == (10, 10_000)


def test_planned_chunks_give_the_one_chunk_result(available):
    la = _last_layer_diag(50)
    x = torch.randn(11, 20)
    ref = la(x, chunk_size=None)
    memory = plan.laplace_plan(la, x[:1], batch=1)[0]
    available(int((memory.predict_fixed + 2.5 * memory.predict_per_input) / la.memory_budget))
    assert plan.planned_chunk(la, x, None) == 2
    torch.testing.assert_close(la(x, chunk_size=None), ref, rtol=1e-6, atol=1e-7)


def test_probe_fit_time_is_positive_and_grows_with_batches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    X, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def make():
        return Laplace(model, "classification", subset_of_weights="all", hessian_structure="kron")

    one, many = plan.probe_fit_time(make, X, y, 1), plan.probe_fit_time(make, X, y, 1000)
    assert 0 < one < many
