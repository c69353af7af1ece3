"""Deep ensembles and MoLA (laplace_lab.training.ensemble, predictors.mixture_predictor)."""

from __future__ import annotations

import json

import pytest
import torch

from laplace_lab.train import run
from laplace_lab.training import ensemble
from laplace_lab.training.fit import train_map
from laplace_lab.training.posthoc import fit_posthoc_laplace
from laplace_lab.training.predictors import laplace_predictor, map_predictor, mixture_predictor
from tests.conftest import compose_config, run_config

pytestmark = pytest.mark.usefixtures("one_thread")
TOY = ["data=toy2d", "data.n_train=64", "model=mlp", "trainer.max_epochs=2", "logger=csv",
       "trainer.enable_progress_bar=false", "evaluation.progress=false", "evaluation.toy2d.enabled=false",
       "evaluation.ood.n_generated=64", "torch_num_threads=1"]


def _cfg(tmp_path, *overrides):
    return compose_config([*TOY, f"paths.output_root={tmp_path / 'out'}", *overrides])


def _run(tmp_path, *overrides):
    return run_config([*TOY, f"paths.output_root={tmp_path / 'out'}", *overrides])


def _weights(module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(module.model.parameters()).detach()


# ------------------------------------------------------------------------------ mixture predictor
def test_regression_mixture_variance_is_the_law_of_total_variance():
    gen = torch.Generator().manual_seed(0)
    means = [torch.randn(7, 2, generator=gen) for _ in range(4)]
    variances = [torch.rand(7, 2, generator=gen) + 0.1 for _ in range(4)]
    members = [lambda x, m=m, v=v: (m, v) for m, v in zip(means, variances)]
    mean, var = mixture_predictor(members, "regression")(torch.zeros(7, 3))
    m, v = torch.stack(means), torch.stack(variances)
    torch.testing.assert_close(mean, m.mean(0))
    # second moment of the mixture minus its squared mean (an independent route to the variance)
    torch.testing.assert_close(var, (v + m**2).mean(0) - m.mean(0) ** 2)
    torch.testing.assert_close(var, v.mean(0) + ((m - m.mean(0)) ** 2).sum(0) / 4)  # divisor K, not K - 1


def test_mixture_rejects_bad_input():
    with pytest.raises(ValueError, match="task='ranking'.*allowed"):
        mixture_predictor([lambda x: x], "ranking")
    with pytest.raises(ValueError, match="at least one member"):
        mixture_predictor([], "classification")


def test_mola_is_the_mean_of_member_laplace_predictives(tmp_path):
    """Members trained and fitted one by one; the ensemble's mixtures (members 1.. reloaded from
    the MAP cache) equal the averages of those separately computed predictives."""
    cfg = _run(tmp_path, "method=mola", "ensemble.size=3", "map_cache.enabled=true")
    modules, laplaces, preds_la, preds_map = [], [], [], []
    x = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))
    for k in range(3):
        mcfg = ensemble.member_config(cfg, k)
        datamodule, module, _, _ = train_map(mcfg, tmp_path / f"sep{k}", [])
        la, _ = fit_posthoc_laplace(mcfg, module, datamodule)
        module.eval()
        modules.append(module)
        laplaces.append(la)
        preds_la.append(laplace_predictor(la, cfg.predictive)(x).detach())
        preds_map.append(map_predictor(module)(x).detach())
    predictors, metrics = ensemble.fit_members(cfg, tmp_path / "ens", modules[0], None, train_map)
    assert metrics["ensemble/cache_hits"] == 2.0 and "mola" not in predictors  # no Laplace for member 0 given
    predictors, _ = ensemble.fit_members(cfg, tmp_path / "ens", modules[0], laplaces[0], train_map)
    torch.testing.assert_close(predictors["mola"](x).detach(), torch.stack(preds_la).mean(0))
    torch.testing.assert_close(predictors["de"](x).detach(), torch.stack(preds_map).mean(0))
    assert not torch.allclose(preds_la[0], predictors["mola"](x).detach())  # the members differ


# --------------------------------------------------------------------------- seeds and the cache
def test_members_are_distinct_and_reproducible_from_the_seed(tmp_path):
    cfg = _run(tmp_path, "method=deep_ensemble", "seed=3", "ensemble.seed_stride=10")
    assert [ensemble.member_config(cfg, k).seed for k in range(3)] == [3, 13, 23]
    first = [_weights(train_map(ensemble.member_config(cfg, k), tmp_path / f"a{k}", [])[1]) for k in range(2)]
    again = _weights(train_map(ensemble.member_config(cfg, 1), tmp_path / "b1", [])[1])
    assert not torch.allclose(first[0], first[1])
    torch.testing.assert_close(first[1], again, rtol=0, atol=0)


def test_ensemble_of_one_equals_the_single_model(tmp_path):
    single = run(_cfg(tmp_path, "method=la", "map_cache.enabled=true"), tmp_path / "single")
    ens = run(_cfg(tmp_path, "method=mola", "ensemble.size=1", "map_cache.enabled=true"), tmp_path / "ens")
    assert ens["map_cache/hit"] == 1.0  # member 0 is the single run's network, from the cache
    test_keys = [k for k in single if k.startswith("test/")]
    assert test_keys and any("/la/" in k for k in test_keys)
    for key in test_keys:
        assert ens[key] == single[key], key
        mixture_key = key.replace("/la/", "/mola/").replace("/map/", "/de/")
        assert ens[mixture_key] == pytest.approx(single[key], abs=1e-6), mixture_key
    assert any(k.startswith("ood/") and "/mola/" in k for k in ens)


def test_member_jobs_fill_the_cache_the_ensemble_reuses(tmp_path):
    """``ensemble.member=k`` trains member k only; the ensemble job then trains nothing new,
    and a single run with a member's seed shares that member's network."""
    common = ["method=deep_ensemble", "ensemble.size=2", "map_cache.enabled=true", "evaluation=none"]
    member = run(_cfg(tmp_path, *common, "ensemble.member=1"), tmp_path / "m1")
    assert member["ensemble/member_seed"] == 1000.0 and not any(k.startswith("test/") for k in member)
    assert json.loads((tmp_path / "m1" / "metrics.json").read_text())["ensemble/member"] == 1.0
    assert len(list((tmp_path / "out" / "map_cache").glob("*.pt"))) == 1
    ens = run(_cfg(tmp_path, *common), tmp_path / "ens")
    assert ens["ensemble/cache_hits"] == 1.0 and ens["ensemble/fit_s"] == 0.0
    single = run(_cfg(tmp_path, "method=map", "seed=1000", "map_cache.enabled=true", "evaluation=none"),
                 tmp_path / "single")
    assert single["map_cache/hit"] == 1.0


def test_regression_ensemble_runs(tmp_path):
    metrics = run(compose_config(["data=sinusoid", "model=mlp", "trainer.max_epochs=3", "logger=csv",
                                  "trainer.enable_progress_bar=false", "evaluation=regression",
                                  "evaluation.progress=false", "method=mola", "ensemble.size=2",
                                  f"paths.output_root={tmp_path / 'out'}"]), tmp_path / "run")
    for name in ("map", "la", "de", "mola"):
        assert f"test/{name}/ll" in metrics and f"test/{name}/rmse" in metrics
    assert metrics["test/de/rmse"] != metrics["test/map/rmse"]


# ------------------------------------------------------------------------------ config validation
@pytest.mark.parametrize("overrides, match", [
    (["method=mola", "ensemble.size=0"], r"ensemble.size must be a positive integer; got 0"),
    (["method=mola", "ensemble.size=2.5"], r"ensemble.size must be a positive integer"),
    (["method=mola", "ensemble.seed_stride=0"], r"ensemble.seed_stride must be a positive integer"),
    (["method=mola", "ensemble.enabled=maybe"], r"ensemble.enabled=.maybe. has the wrong type: got a str; allowed: a bool"),
    (["method=la", "ensemble.member=0"], r"ensemble.member needs ensemble.enabled=true"),
    (["method=mola", "map_cache.enabled=true", "ensemble.member=5"], r"ensemble.member must be null or an integer in \[0, ensemble.size=5\)"),
    (["method=mola", "ensemble.member=1"], r"needs map_cache.enabled=true"),
    (["method=mola", "map_grid=[1.0,10.0]"], r"map_grid is not supported with ensemble.enabled=true"),
    (["method=deep_ensemble", "checkpoint.resume_from=x.ckpt"], r"checkpoint.resume_from resumes one network"),
])
def test_bad_ensemble_options_fail_before_any_work(overrides, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run(_cfg(tmp_path, *overrides), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_fgsm_attacks_member_0_and_each_mixture_itself(tmp_path):
    """``fgsm_map`` attacks member 0's network (the run's ``attack_model``) and evaluates every
    predictor on those inputs; ``fgsm_self`` differentiates through each mixture."""
    cfg = compose_config(["data=fake_data", "model=lenet", "trainer=debug", "logger=csv", "method=mola",
                          "ensemble.size=2", "evaluation=full", "evaluation.adversarial.attack_laplace=true",
                          "evaluation.max_test_batches=1", "evaluation.adversarial.max_batches=1",
                          "evaluation.adversarial.epsilons=[0.0,0.1]", "evaluation.adversarial.confmax.enabled=false",
                          "evaluation.ood.enabled=false", "evaluation.shift.rotation.enabled=false",
                          "evaluation.reliability_diagram=false",
                          "evaluation.progress=false", f"paths.output_root={tmp_path / 'out'}"])
    metrics = run(cfg, tmp_path / "run")
    for section in ("fgsm_map", "fgsm_self"):
        for name in ("map", "la", "de", "mola"):
            assert f"{section}/eps_0.1/{name}/acc" in metrics, (section, name)
    assert metrics["fgsm_map/eps_0/de/acc"] == metrics["test/de/acc"]  # same first batch, unperturbed
