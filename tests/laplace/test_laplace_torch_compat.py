"""laplace-torch behaviours beyond the API items of ``test_laplace_torch_api``: each checked
against laplace-torch on the same model (float64) where it has the behaviour, else against a dense
reference."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from laplace_refs import loader, mlp
from torch import nn

from laplace_lab.laplace import Laplace

laplace_torch = pytest.importorskip("laplace")
DT = torch.float64


def _data(n=12, d_in=3, d_out=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g, dtype=DT), torch.randn(n, d_out, generator=g, dtype=DT)


@pytest.mark.parametrize("lik", ["classification", "regression"])
def test_nn_predictive_needs_mc_link_like_laplace_torch(lik):
    """laplace-torch's default link_approx is "probit" and pred_type="nn" accepts only "mc"."""
    model = mlp(d_out=2)
    X, y = _data()
    if lik == "classification":
        y = y[:, 0].gt(0).long()
    ours = Laplace(model, lik, "all", "diag")
    ours.fit(loader(X, y))
    theirs = laplace_torch.Laplace(model, lik, subset_of_weights="all", hessian_structure="diag")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs.fit(loader(X, y))
    for la in (ours, theirs):
        with pytest.raises(ValueError):
            la(X, pred_type="nn", n_samples=3)
        with pytest.raises(ValueError):
            la(X, pred_type="nn", link_approx="probit", n_samples=3)
    with pytest.raises(ValueError, match="link_approx must be 'mc'"):
        ours(X, pred_type="nn")
    out = ours(X, pred_type="nn", link_approx="mc", n_samples=3)
    assert (out[0] if isinstance(out, tuple) else out).shape == (len(X), 2)
    ours(X, pred_type="nn", link_approx=None, n_samples=3)  # None: the natural link of the pred_type


def test_config_rejects_nn_with_a_closed_form_link():
    from laplace_lab.config.load import load_run_config as validate_laplace_config
    from tests.conftest import compose_config

    validate_laplace_config(compose_config(["predictive=nn_mc"]))
    with pytest.raises(ValueError, match=r"predictive.pred_type='nn'.*predictive.link_approx must be 'mc'.*got predictive.link_approx='probit'"):
        validate_laplace_config(compose_config(["predictive=nn_mc", "predictive.link_approx=probit"]))


@pytest.mark.parametrize("structure", ["full", "kron", "diag"])
def test_mean_and_log_prob_before_fit_are_the_prior(structure):
    """Before ``fit``: ``mean`` is the prior mean and ``log_prob`` the prior density (laplace-torch)."""
    model = mlp(d_out=2)
    mu0 = 0.1 * torch.randn(sum(p.numel() for p in model.parameters()), generator=torch.Generator().manual_seed(0),
                            dtype=DT)
    ours = Laplace(model, "classification", "all", structure, prior_precision=0.7, prior_mean=mu0)
    theirs = laplace_torch.Laplace(model, "classification", subset_of_weights="all", hessian_structure=structure,
                                   prior_precision=0.7, prior_mean=mu0)
    torch.testing.assert_close(ours.mean, mu0)
    theta = torch.randn(ours.n_params, generator=torch.Generator().manual_seed(1), dtype=DT)
    dense = torch.distributions.Normal(mu0, math.sqrt(1 / 0.7)).log_prob(theta).sum()
    torch.testing.assert_close(ours.log_prob(theta), dense)
    torch.testing.assert_close(ours.log_prob(theta), theirs.log_prob(theta))
    torch.testing.assert_close(ours.log_prob(theta, normalized=False), -0.5 * 0.7 * (theta - mu0).square().sum())
    X, y = _data()
    ours.fit(loader(X, y[:, 0].gt(0).long()))
    torch.testing.assert_close(ours.mean, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))


@pytest.mark.parametrize("structure", ["full", "kron", "diag"])
def test_flat_state_dict_round_trip(structure, tmp_path):
    """``state_dict`` is flat (no nested dicts: laplace-torch's no-pickle rule) and round-trips through
    ``torch.save`` / ``torch.load(weights_only=True)``; the earlier nested format still loads."""
    model = mlp(d_out=2)
    X, y = _data()
    la = Laplace(model, "regression", "all", structure, sigma_noise=0.8, prior_precision=2.0)
    la.fit(loader(X, y))
    sd = la.state_dict()
    assert all(v is None or isinstance(v, (list, tuple, int, float, str, bool, torch.Tensor)) for v in sd.values())
    torch.save(sd, tmp_path / "la.pt")
    la2 = Laplace(model, "regression", "all", structure)
    la2.load_state_dict(torch.load(tmp_path / "la.pt", weights_only=True))
    for a, b in zip(la(X), la2(X)):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(la.log_marginal_likelihood(), la2.log_marginal_likelihood())
    config = ("likelihood", "subset_of_weights", "hessian_structure", "curvature", "prior_structure", "n_mc_samples",
              "n_params")
    nested = {k: v for k, v in sd.items() if k not in config and not k.startswith("structure.")}
    nested["config"] = {k: sd[k] for k in config}
    nested["structure"] = {k[len("structure."):]: v for k, v in sd.items() if k.startswith("structure.")}
    la3 = Laplace(model, "regression", "all", structure)
    la3.load_state_dict(nested)
    torch.testing.assert_close(la3.log_marginal_likelihood(), la.log_marginal_likelihood())
    with pytest.raises(ValueError, match="does not match"):
        Laplace(model, "regression", "all", "diag" if structure != "diag" else "full").load_state_dict(sd)


def test_regression_targets_must_match_the_output_shape():
    """``[N]`` targets for ``[N, 1]`` outputs: laplace-torch raises ``ValueError``; so do we (before any work)."""
    model = mlp(d_out=1)
    X, y = _data(d_out=1)
    for make in (lambda: Laplace(model, "regression", "all", "kron"),
                 lambda: laplace_torch.Laplace(model, "regression", subset_of_weights="all", hessian_structure="kron")):
        with pytest.raises(ValueError):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                make().fit(loader(X, y[:, 0]))
    la = Laplace(model, "regression", "all", "kron")
    with pytest.raises(ValueError, match=r"y \(12,\) for output \(12, 1\)"):
        la.fit(loader(X, y[:, 0], 12))
    la.fit(loader(X, y))  # [N, 1] targets: fine


@pytest.mark.parametrize("structure", ["full", "kron", "diag"])
def test_likelihood_changed_after_fit_keeps_the_posterior(structure):
    """laplace-torch: ``la.likelihood = "classification"`` after a regression fit leaves the functional
    samples unchanged (the curvature scale stays ``1 / sigma^2``); both libraries agree."""
    model = mlp(d_out=2)
    X, y = _data()
    ours = Laplace(model, "regression", "all", structure, sigma_noise=0.3, prior_precision=0.7)
    ours.fit(loader(X, y))
    theirs = laplace_torch.Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure,
                                   sigma_noise=0.3, prior_precision=0.7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs.fit(loader(X, y))
    before = ours.functional_samples(X, n_samples=50, generator=torch.Generator().manual_seed(4))
    v_before = ours(X, diagonal_output=True)[1]
    ours.likelihood = theirs.likelihood = "classification"
    after = ours.functional_samples(X, n_samples=50, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(after, before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(ours(X), theirs(X, pred_type="glm", link_approx="probit"))
    probs = ours(X)  # the predictive now follows the new likelihood, with the same latent variance
    f = model(X).detach()
    torch.testing.assert_close(probs, torch.softmax(f / torch.sqrt(1 + math.pi / 8 * v_before), -1))
    with pytest.raises(ValueError, match="likelihood"):
        ours.likelihood = "poisson"


# ------------------------------------------------------------------ laplace-torch's internals, adapted
def _ll_pair(flavour, lik="regression", **kw):
    from laplace_lab.laplace import compat

    model = mlp(d_out=2)
    X, y = _data()
    if lik == "classification":
        y = y[:, 0].gt(0).long()
    ours = getattr(compat, flavour)(model, lik, **kw)
    theirs = getattr(laplace_torch, flavour)(model, lik, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours.fit(loader(X, y))
        theirs.fit(loader(X, y))
    return model, X, ours, theirs


def test_feature_extractor_features_and_last_layer_search():
    from laplace_lab.laplace.compat import FeatureExtractor

    model = mlp(d_out=2)
    X, _ = _data()
    fe = FeatureExtractor(model)
    out, phi = fe.forward_with_features(X)  # first call finds the last layer: the last leaf module run
    assert fe.last_layer is model[-1]
    torch.testing.assert_close(out, model(X))
    torch.testing.assert_close(phi, model[:-1](X))
    ref = laplace_torch.utils.FeatureExtractor(model)
    torch.testing.assert_close(phi, ref.forward_with_features(X)[1])
    assert not phi.requires_grad and FeatureExtractor(model, "4", enable_backprop=True).forward_with_features(X)[1].requires_grad
    with pytest.raises(ValueError, match="last_layer_name='nope'"):
        FeatureExtractor(model, last_layer_name="nope")
    with pytest.raises(ValueError, match="nn.Linear"):
        FeatureExtractor(model, last_layer_name="1")
    with pytest.raises(ValueError, match="feature_reduction"):
        FeatureExtractor(model, feature_reduction="max")


@pytest.mark.parametrize("reduction", ["pick_first", "pick_last", "average"])
def test_feature_reduction_of_sequence_features(reduction):
    from laplace_lab.laplace.compat import FeatureExtractor

    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(DT)
    X = torch.randn(5, 6, 3, generator=torch.Generator().manual_seed(0), dtype=DT)  # [B, sequence, features]
    h = model[:-1](X)
    expected = {"pick_first": h[:, 0], "pick_last": h[:, -1], "average": h.mean(1)}[reduction]
    phi = FeatureExtractor(model, "2", feature_reduction=reduction).forward_with_features(X)[1]
    torch.testing.assert_close(phi, expected)
    theirs = laplace_torch.utils.FeatureExtractor(model, "2", feature_reduction=reduction)
    torch.testing.assert_close(phi, theirs.forward_with_features(X)[1])


@pytest.mark.parametrize("flavour", ["FullLLLaplace", "DiagLLLaplace", "KronLLLaplace"])
def test_backend_jacobians_and_functional_variance_fast(flavour):
    model, X, ours, theirs = _ll_pair(flavour)
    Js, f = ours.backend.last_layer_jacobians(X)
    Js_t, f_t = theirs.backend.last_layer_jacobians(X)
    torch.testing.assert_close(Js, Js_t)
    torch.testing.assert_close(f, f_t)
    fm, fv = ours.functional_variance_fast(X)
    torch.testing.assert_close(fm, model(X).detach())
    torch.testing.assert_close(fv, ours.functional_variance(Js).diagonal(dim1=1, dim2=2))
    if flavour != "KronLLLaplace":  # laplace-torch has no kron version
        torch.testing.assert_close(fv, theirs.functional_variance_fast(X)[1])
    with pytest.raises(ValueError, match="last_layer"):
        _ll_pair("DiagLaplace")[2].backend.last_layer_jacobians(X)


@pytest.mark.parametrize("flavour", ["FullLaplace", "KronLaplace", "DiagLaplace", "FullLLLaplace", "KronLLLaplace"])
def test_H_views_before_and_after_fit(flavour):
    from laplace_lab.laplace import compat

    model = mlp(d_out=2)
    kw = {"last_layer_name": "4"} if "LL" in flavour else {}
    ours = getattr(compat, flavour)(model, "regression", **kw)
    theirs = getattr(laplace_torch, flavour)(model, "regression", **kw)
    if "Kron" in flavour:
        assert [[k.shape for k in f] for f in ours.H.kfacs] == [[k.shape for k in f] for f in theirs.H.kfacs]
        assert all(bool((k == 0).all()) for f in ours.H.kfacs for k in f)
    else:
        torch.testing.assert_close(ours.H, theirs.H)  # zeros of laplace-torch's shape
    X, y = _data()
    for la in (ours, theirs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            la.fit(loader(X, y))
    if "Kron" in flavour:
        assert isinstance(ours.H, compat.KronDecomposed)
        torch.testing.assert_close(ours.H.to_matrix(), theirs.H.to_matrix(), rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(ours.H_facs.to_matrix(), theirs.H_facs.to_matrix(), rtol=1e-8, atol=1e-10)
        H = ours.H.to_matrix()
    else:
        torch.testing.assert_close(ours.H, theirs.H, rtol=1e-6, atol=1e-10)
        H = ours.H.clone()
    if "LL" not in flavour:  # online fit (override=False) adds up
        ours.fit(loader(X, y), override=False)
        torch.testing.assert_close(ours.H.to_matrix() if "Kron" in flavour else ours.H, 2 * H)
    ours._init_H()
    assert not ours.fitted


@pytest.mark.parametrize("flavour", ["FullLLLaplace", "KronLLLaplace", "DiagLLLaplace"])
def test_last_layer_found_during_fit(flavour):
    """laplace-torch: without ``last_layer_name`` the last layer is found by the first forward of ``fit``;
    before it ``mean`` and ``H`` are ``None`` and a full-model ``prior_mean`` is not checked yet."""
    from laplace_lab.laplace import compat

    model = mlp(d_out=2)
    X, y = _data()
    y = y[:, 0].gt(0).long()
    P_all = sum(p.numel() for p in model.parameters())
    lazy = getattr(compat, flavour)(model, "classification", prior_precision=0.5, prior_mean=torch.zeros(P_all))
    assert lazy.mean is None and lazy.H is None and lazy.n_params is None
    assert lazy.prior_precision == 0.5 and lazy.prior_mean.shape == (P_all,)
    with pytest.raises(AttributeError, match="before fit"):
        lazy.log_marginal_likelihood()
    with pytest.raises(ValueError, match="prior_mean"):
        lazy.fit(loader(X, y))  # checked once the last layer (and n_params) is known
    ours = getattr(compat, flavour)(model, "classification", prior_precision=0.5)
    ours.fit(loader(X, y))
    assert ours.entries[0].module is model[-1]
    eager = getattr(compat, flavour)(model, "classification", prior_precision=0.5, last_layer_name="4")
    eager.fit(loader(X, y))
    theirs = getattr(laplace_torch, flavour)(model, "classification", prior_precision=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs.fit(loader(X, y))
    torch.testing.assert_close(ours.log_marginal_likelihood(), eager.log_marginal_likelihood())
    torch.testing.assert_close(ours.log_marginal_likelihood(), theirs.log_marginal_likelihood(), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(ours.mean, theirs.mean)


def test_predictive_chunks_inputs_by_default():
    """``la(X)`` runs the model on at most 256 inputs at a time without the caller passing ``chunk_size``
    (a drop-in must scale: 10k MNIST-sized inputs must not hold all activations and Jacobian blocks at once)."""
    model = mlp(d_out=2)
    X, y = _data(n=600)
    la = Laplace(model, "classification", "all", "kron")
    la.fit(loader(X[:20], y[:20, 0].gt(0).long()))
    sizes = []
    handle = model[0].register_forward_hook(lambda m, a, o: sizes.append(a[0].shape[0]))
    try:
        p = la(X)
        la(X, pred_type="nn", link_approx="mc", n_samples=2)
    finally:
        handle.remove()
    assert max(sizes) <= 256 and sum(sizes) >= 2 * 600
    torch.testing.assert_close(p, la(X, chunk_size=None))  # chunking does not change the result


class _RewardModel(nn.Module):
    """laplace-torch's reward-modelling convention: ``[B, 2, D]`` pairs -> ``[B, 2]`` logits when fitting,
    ``[B, D]`` -> ``[B, 1]`` rewards when predicting."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1)).double()

    def forward(self, x):
        return self.net(x)[..., 0] if x.ndim == 3 else self.net(x)


@pytest.mark.parametrize("flavour", ["KronLaplace", "DiagLaplace"])
def test_reward_modeling_matches_laplace_torch(flavour):
    from laplace_lab.laplace import compat

    model = _RewardModel()
    g = torch.Generator().manual_seed(3)
    X, y, Xt = torch.randn(10, 2, 3, generator=g, dtype=DT), torch.randint(2, (10,), generator=g), torch.randn(
        7, 3, generator=g, dtype=DT)
    ours = getattr(compat, flavour)(model, "reward_modeling", prior_precision=0.8)
    theirs = getattr(laplace_torch, flavour)(model, "reward_modeling", prior_precision=0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours.fit(loader(X, y, 5))
        theirs.fit(loader(X, y, 5))
        m_t, v_t = theirs(Xt, pred_type="glm")
        p_t = theirs(X, pred_type="glm", fitting=True)
    assert ours.reward_modeling and ours.likelihood == "classification"
    torch.testing.assert_close(ours.log_marginal_likelihood(), theirs.log_marginal_likelihood(), rtol=1e-8, atol=1e-8)
    m, v = ours(Xt)  # regression predictive of the reward: [B, 1], [B, 1, 1]
    torch.testing.assert_close(m, m_t)
    torch.testing.assert_close(v, v_t, rtol=1e-6, atol=1e-10)
    torch.testing.assert_close(ours(X, fitting=True), p_t, rtol=1e-6, atol=1e-10)  # pair probabilities
    m_nn, v_nn = ours(Xt, pred_type="nn", link_approx="mc", n_samples=5)
    assert m_nn.shape == v_nn.shape == (7, 1)
    assert ours.likelihood == "classification"  # restored after each predictive call
    ours.optimize_prior_precision(method="gridsearch", val_loader=loader(X, y, 5), grid_size=3)


@pytest.mark.parametrize("flavour", ["FullLLLaplace", "KronLLLaplace", "DiagLLLaplace"])
def test_last_layer_state_dict_names_the_layer(flavour, tmp_path):
    """A last-layer flavour still searching its last layer loads a saved state (the name is in the
    flat dict); one built for another last layer, or another likelihood, refuses it."""
    from laplace_lab.laplace import compat

    model = mlp(d_out=2)
    X, y = _data()
    la = getattr(compat, flavour)(model, "regression", sigma_noise=0.6)
    la.fit(loader(X, y))
    sd = la.state_dict()
    assert sd["last_layer_name"] == "4"
    torch.save(sd, tmp_path / "la.pt")
    lazy = getattr(compat, flavour)(model, "regression")
    lazy.load_state_dict(torch.load(tmp_path / "la.pt", weights_only=True))
    for a, b in zip(la(X), lazy(X)):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="last_layer_name='4'"):
        getattr(compat, flavour)(model, "regression", last_layer_name="2").load_state_dict(sd)
    with pytest.raises(ValueError, match="likelihood"):
        getattr(compat, flavour)(model, "classification").load_state_dict(sd)
