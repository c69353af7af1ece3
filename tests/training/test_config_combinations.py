"""Every valid curvature x prior x marglik combination composes and validates; invalid ones are
rejected before any data is loaded, naming the options."""

from __future__ import annotations

import itertools

import pytest

from laplace_lab.config.load import load_run_config
from tests.conftest import CONF_DIR, compose_config

CURVATURES = sorted(f.stem for f in (CONF_DIR / "curvature").glob("*.yaml"))
PRIORS = sorted(f.stem for f in (CONF_DIR / "prior").glob("*.yaml"))
MARGLIKS = sorted(f.stem for f in (CONF_DIR / "marglik").glob("*.yaml"))
TYPES = ["ggn", "ef", "mc_fisher"]
COMBOS = list(itertools.product(CURVATURES, TYPES, PRIORS, MARGLIKS))


def is_valid(curvature: str, ctype: str, prior: str) -> bool:
    structure = curvature.removeprefix("ll_")
    return not (structure == "kron" and prior == "diagonal") and not (structure == "lowrank" and ctype == "mc_fisher")


@pytest.mark.parametrize("curvature,ctype,prior,marglik", COMBOS, ids=["-".join(c) for c in COMBOS])
def test_combination(curvature, ctype, prior, marglik):
    cfg = compose_config([f"curvature={curvature}", f"curvature.type={ctype}", f"prior={prior}",
                          f"marglik={marglik}"])
    if is_valid(curvature, ctype, prior):
        load_run_config(cfg)
    else:
        with pytest.raises(ValueError, match=r"prior.structure='diagonal'.*curvature.hessian_structure='kron'|"
                                             r"'lowrank' needs curvature.type in \['ggn', 'ef'\]"):
            load_run_config(cfg)


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (["marglik=online", "marglik.fused=true", "curvature.type=ggn"], r"marglik.fused=true needs curvature.type in \['ef', 'mc_fisher'\]"),
        (["marglik=online", "marglik.fused=true", "curvature=ll_kron", "curvature.type=ef"], r"subset_of_weights='all'"),
        (["marglik=online", "marglik.frequency=0"], r"marglik.frequency must be >= 1"),
        (["marglik=online", "marglik.posthoc_prior=cv"], r"marglik.posthoc_prior='cv'.*allowed"),
        (["marglik.mode=sometimes"], r"marglik.mode='sometimes'.*allowed: \['off', 'online', 'posthoc'\]"),
        (["curvature.hessian_structure=blockdiag"], r"curvature.hessian_structure='blockdiag'.*allowed"),
        (["curvature=lowrank", "marglik=online", "marglik.fused=true", "curvature.type=ef"], r"marglik.fused=true needs"),
        (["curvature.subset_of_weights=first_layer"], r"curvature.subset_of_weights='first_layer'.*allowed"),
        (["predictive.pred_type=exact"], r"predictive.pred_type='exact'.*allowed"),
        (["curvature.type=mc_fisher", "curvature.n_mc_samples=0"], r"curvature.n_mc_samples must be >= 1"),
        (["prior.structure=groups"], r"prior.structure='groups'.*allowed: \['scalar', 'layerwise', 'diagonal', 'normgroups'\]"),
        (["marglik.evidence_point=mode"], r"marglik.evidence_point='mode'.*allowed: \['weights', 'linear_mode'\]"),
        (["marglik.evidence_point=linear_mode", "curvature.type=ef"], r"linear_mode' needs curvature.type='ggn'"),
        (["marglik.evidence_point=linear_mode", "marglik.posthoc_prior=gridsearch"],
         r"linear_mode' needs marglik.posthoc_prior in \['none', 'marglik'\]"),
        (["marglik=online", "+marglik.evidence_point=linear_mode"], r"linear_mode' needs marglik.mode in \['off', 'posthoc'\]"),
        (["marglik=off", "predictive=map", "marglik.evidence_point=linear_mode"], r"linear_mode' needs a post-hoc Laplace"),
        (["marglik.evidence_point=linear_mode", "likelihood=heteroscedastic_regression", "data=sinusoid"],
         r"linear_mode' needs likelihood in \['auto', 'classification', 'regression'\]"),
        (["het_head=half_softplus", "likelihood=regression"],
         r"het_head='half_softplus' is a head of likelihood=heteroscedastic_regression"),
        (["het_head=exp", "likelihood=heteroscedastic_regression", "data=sinusoid"],
         r"het_head='exp' is not supported; allowed: \['softplus', 'half_softplus'\]"),
        (["predictive.het_approx=eta2"], r"predictive.het_approx='eta2'.*allowed: \['mean', 'natural'\]"),
        (["likelihood=regression", "predictive.het_approx=natural"],
         r"predictive.het_approx='natural' needs likelihood=heteroscedastic_regression"),
        (["method=het_online", "data=sinusoid", "predictive.link_approx=mc"],
         r"predictive.het_approx='natural' is a closed form of the glm predictive"),
        (["curvature=kron", "curvature.kfac_approx=sum"], r"curvature.kfac_approx='sum' is not supported; allowed: \['expand', 'reduce', 'backpack'\]"),
        (["curvature=diag", "+curvature.kfac_approx=reduce"], r"curvature.kfac_approx is an option of another hessian_structure"),
        (["curvature=kron", "+curvature.n_eigs=5"], r"curvature.n_eigs is an option of another hessian_structure.*'kron'"),
    ],
)
def test_rejected(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_run_config(compose_config(overrides))


@pytest.mark.parametrize("overrides", [
    ["prior=normgroups", "curvature=kron", "marglik.evidence_point=linear_mode"],
    ["prior=normgroups", "curvature=full", "marglik=off", "marglik.evidence_point=linear_mode"],
    ["prior=scalar", "curvature=ll_kron", "marglik.posthoc_prior=none", "marglik.evidence_point=linear_mode"],
    ["prior=normgroups", "marglik=online", "curvature=kron", "curvature.type=ef", "marglik.fused=true"],
])
def test_antoran_options_accepted(overrides):
    load_run_config(compose_config(overrides))


@pytest.mark.parametrize("overrides", [
    ["curvature=kron", "curvature.kfac_approx=reduce"],
    ["curvature=kron", "curvature.hessian_structure=diag"],  # kron.yaml's default kfac_approx is not stray
])
def test_structure_options_accepted(overrides):
    load_run_config(compose_config(overrides))
