"""The engine refuses nonsense: every case a ``ValueError`` naming the argument and what it
got, in the engine and through ``compat``; good inputs keep working (the checks can fail both ways)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from laplace_lab.laplace import compat
from laplace_lab.laplace.checks import BatchChecks, HyperparameterError, positive_finite
from laplace_lab.laplace.laplace import Laplace

torch.manual_seed(0)
X = torch.randn(20, 3)
Y_CLS = torch.randint(0, 2, (20,))
Y_REG = torch.randn(20, 1)


def mlp(out: int = 2) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, out))


def loader(x=X, y=Y_CLS, batch_size: int = 5) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def engine(structure="kron", likelihood="classification", out=2, **kw):
    return Laplace(mlp(out), likelihood, "all", structure, **kw)


def flavours(likelihood="classification", out=2, **kw):
    """The engine and the compat objects (last layer found lazily, all weights) for one case."""
    return [engine("kron", likelihood, out, **kw), engine("full", likelihood, out, **kw),
            compat.Laplace(mlp(out), likelihood, **kw), compat.Laplace(mlp(out), likelihood, "all", "diag", **kw)]


EMPTY = DataLoader(TensorDataset(X[:0], Y_CLS[:0]), batch_size=5)


@pytest.mark.parametrize("i", range(4))
def test_empty_loader_is_refused(i):
    la = flavours()[i]
    with pytest.raises(ValueError, match="train_loader yielded no data"):
        la.fit(EMPTY)


def test_empty_loader_is_refused_by_self_fitting_structure():
    with pytest.raises(ValueError, match="train_loader yielded no data"):
        engine("lowrank", n_eigs=3).fit(EMPTY)


BAD = [-1.0, 0.0, float("nan"), float("inf")]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("option", ["prior_precision", "sigma_noise"])
def test_non_positive_or_non_finite_hyperparameters(option, value):
    with pytest.raises(ValueError, match=rf"{option} must be finite and > 0; got {value:g}"):
        engine(likelihood="regression", out=1, **{option: value})
    la = engine("full", likelihood="regression", out=1)
    la.fit(loader(y=Y_REG))
    with pytest.raises(ValueError, match=option):
        setattr(la, option, value)
    with pytest.raises(ValueError, match=option):
        la.log_marginal_likelihood(**{option: torch.tensor(value)})
    la = compat.Laplace(mlp(1), "regression", **{option: value})  # lazy last layer: checked at fit
    with pytest.raises(ValueError, match=option):
        la.fit(loader(y=Y_REG))


def test_prior_precision_tensor_with_a_bad_entry_names_it():
    good = torch.ones(4)  # layerwise: 4 parameter tensors
    la = engine("diag", prior_precision=good)
    la.prior_precision = good  # a good tensor passes
    bad = good.clone()
    bad[2] = float("nan")
    with pytest.raises(ValueError, match=r"prior_precision must be finite and > 0; got a tensor of 4 entries "
                                         r"with 1 bad, e.g. \[2\]=nan"):
        la.prior_precision = bad
    with pytest.raises(ValueError, match="prior_precision"):
        engine(prior_precision=torch.tensor([1.0, 1.0, -3.0, 1.0]))


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "warm"])
def test_temperature_must_be_positive_and_finite(value):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        engine(temperature=value)
    with pytest.raises(ValueError, match="temperature"):
        compat.Laplace(mlp(), "classification", "all", "kron", temperature=value)


def test_temperature_of_a_lazy_last_layer_flavour_is_checked_at_construction():
    with pytest.raises(ValueError, match="temperature must be a finite number > 0; got 'warm'"):
        compat.Laplace(mlp(), "classification", temperature="warm")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_prior_mean_must_be_finite(value):
    with pytest.raises(ValueError, match="prior_mean must be finite; got 1 NaN/inf entries of 1"):
        engine(prior_mean=value)
    engine(prior_mean=-3.0)


def test_hyperparameter_error_is_a_value_error():
    assert issubclass(HyperparameterError, ValueError)
    t = torch.tensor([0.5, 2.0], requires_grad=True)
    assert positive_finite("x", t) is t  # the graph is kept


def test_parameterless_model():
    for make in (lambda m: Laplace(m, "regression", "all", "full"), lambda m: compat.Laplace(m, "regression", "all")):
        with pytest.raises(ValueError, match="model Sequential has no parameters"):
            make(nn.Sequential(nn.Tanh()))


class TupleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        return self.body(x), x


@pytest.mark.parametrize("make", [lambda: Laplace(TupleNet(), "classification", "all", "kron"),
                                  lambda: compat.Laplace(TupleNet(), "classification")])
def test_forward_returning_a_tuple(make):
    with pytest.raises(ValueError, match="the model must return a tensor .* returned tuple"):
        make().fit(loader())


@pytest.mark.parametrize("i", range(4))
def test_one_hot_class_targets(i):
    one_hot = nn.functional.one_hot(Y_CLS, 2).float()
    with pytest.raises(ValueError, match=r"targets must be class indices \[N\].*shape \(5, 2\)"):
        flavours()[i].fit(loader(y=one_hot))


def test_float_class_targets_must_be_whole():
    engine().fit(loader(y=Y_CLS.float()))  # float indices 0., 1. are class indices
    with pytest.raises(ValueError, match="class indices y in 1 batch"):
        engine().fit(loader(y=Y_CLS.float() + torch.arange(20).eq(7) * 0.5))


@pytest.mark.parametrize("i", range(4))
def test_nan_inputs_are_named_before_the_decompositions(i):
    Xn = X.clone()
    Xn[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"bad inputs X in 1 batch\(es\)"):
        flavours()[i].fit(loader(x=Xn))


@pytest.mark.parametrize("i", range(4))
def test_non_finite_regression_targets(i):
    y = Y_REG.clone()
    y[12] = float("inf")
    with pytest.raises(ValueError, match=r"bad targets y in 1 batch\(es\).* of 4 batches"):
        flavours("regression", out=1)[i].fit(loader(y=y))


def test_non_finite_outputs():
    la = engine("full")
    with torch.no_grad():
        la.model[2].bias[0] = float("inf")
    with pytest.raises(ValueError, match=r"bad model outputs in 4 batch\(es\)"):
        la.fit(loader())
    assert la.model.training  # the mode fit_begin changed is restored


def test_non_finite_curvature_with_finite_outputs():
    """Hidden activations ~1e20 scaled back by 1e-20: finite outputs, but the last layer's KFAC input
    factor ``a a^T`` (~1e40) overflows float32."""
    la = Laplace(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), "classification", "all", "kron")
    with torch.no_grad():
        la.model[0].weight.mul_(1e20)
        la.model[1].weight.mul_(1e-20)
    with pytest.raises(ValueError, match="the curvature .* is not finite"):
        la.fit(loader())


def test_nan_predictive_inputs():
    la = engine("diag")
    la.fit(loader())
    Xn = X[:4].clone()
    Xn[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"x holds 1 non-finite entries"):
        la(Xn)
    assert la(X[:4]).shape == (4, 2)
    with pytest.raises(ValueError, match=r"x must be a batch \[B, ...\] of at least one input; got shape \(0, 3\)"):
        la(X[:0])


def test_batch_checks_count_on_the_device_and_read_once():
    c = BatchChecks()
    f = torch.zeros(3, 2)
    c.outputs(f, torch.zeros(3, 1))
    c.outputs(f.fill_(float("nan")), torch.zeros(3, 1))
    assert all(v.ndim == 0 for v in c.counts.values())
    with pytest.raises(ValueError, match=r"model outputs in 1 batch\(es\).*of 2 batches"):
        c.raise_if_any(6, torch.zeros(()))
    BatchChecks().raise_if_any(1, torch.zeros(()))
    with pytest.raises(ValueError, match="training loss is not finite"):
        BatchChecks().raise_if_any(1, torch.tensor(float("inf")))


def test_good_inputs_still_fit():
    for la in flavours():
        la.fit(loader())
        assert torch.isfinite(la.log_marginal_likelihood())
