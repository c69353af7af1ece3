"""laplace_lab.reporting.model_selection: marglik rankings vs held-out metrics, on hand-made runs."""

from __future__ import annotations

import math

import pytest

from laplace_lab.reporting import model_selection as ms
from laplace_lab.reporting.tables import Run


def run(data: str, model: str, method: str, **metrics) -> Run:
    return Run(path=None, metrics=metrics, overrides={"data.name": data, "model": model, "method_name": method})


SPEC = {"score": "laplace/log_marglik", "candidates": ["model"], "within": ["data.name"],
        "targets": ["test/acc", "test/nll"], "where": {"method_name": "online"}}


def test_kendall_tau_known_values():
    assert ms.kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert ms.kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert ms.kendall_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)
    assert math.isnan(ms.kendall_tau([1.0], [2.0]))


def test_direction_from_metric_name():
    assert ms.higher_is_better("test/la/acc") and ms.higher_is_better("laplace/log_marglik")
    assert not ms.higher_is_better("test/la/nll") and not ms.higher_is_better("test/map/ece")


def test_rankings_means_tau_and_filter():
    runs = [run("mnist", "mlp", "online", **{"laplace/log_marglik": -300.0, "test/acc": 0.95, "test/nll": 0.20}),
            run("mnist", "mlp", "online", **{"laplace/log_marglik": -200.0, "test/acc": 0.97, "test/nll": 0.10}),
            run("mnist", "lenet", "online", **{"laplace/log_marglik": -100.0, "test/acc": 0.99, "test/nll": 0.05}),
            run("mnist", "cnn", "online", **{"laplace/log_marglik": -400.0, "test/acc": 0.98, "test/nll": 0.50}),
            # other method: ignored (it would reverse the mlp/lenet order)
            run("mnist", "mlp", "map", **{"laplace/log_marglik": 0.0, "test/acc": 0.1, "test/nll": 9.0}),
            run("fmnist", "mlp", "online", **{"laplace/log_marglik": -10.0, "test/acc": 0.80, "test/nll": 0.6}),
            run("fmnist", "lenet", "online", **{"laplace/log_marglik": -20.0, "test/acc": 0.90, "test/nll": 0.3})]
    out = {e["within"]["data.name"]: e for e in ms.rank_candidates(runs, SPEC)}
    mnist = out["mnist"]
    assert [c["model"] for c in mnist["candidates"]] == ["mlp", "lenet", "cnn"]
    assert mnist["n_runs"] == [2, 1, 1]
    assert mnist["means"]["laplace/log_marglik"] == [-250.0, -100.0, -400.0]
    # score order lenet > mlp > cnn; acc order lenet > cnn > mlp: pairs (l,m)+ (l,c)+ (m,c)- -> 1/3
    assert mnist["agreement"]["test/acc"]["kendall_tau"] == pytest.approx(1 / 3)
    assert mnist["agreement"]["test/acc"]["top_agrees"] is True
    # nll (lower better): lenet < mlp < cnn: same order as the score
    assert mnist["agreement"]["test/nll"]["kendall_tau"] == 1.0
    assert out["fmnist"]["agreement"]["test/acc"] == {"kendall_tau": -1.0, "top_agrees": False}
    text = "\n".join(ms.to_markdown(list(out.values()), SPEC))
    assert "### data.name=mnist" in text and "tau 0.3333" in text and "best agrees: False" in text


def test_spec_errors_name_the_keys():
    with pytest.raises(ValueError, match=r"unknown keys \['scores'\].*allowed"):
        ms.validate_spec({**SPEC, "scores": 1})
    with pytest.raises(ValueError, match=r"needs \['targets'\]"):
        ms.validate_spec({k: v for k, v in SPEC.items() if k != "targets"})


def seeded(model: str, seed: int, marglik: float, acc: float) -> Run:
    return Run(path=None, metrics={"laplace/log_marglik": marglik, "test/acc": acc, "test/nll": 1 - acc},
               overrides={"data.name": "mnist", "model": model, "method_name": "online", "seed": str(seed)})


def test_tau_spread_over_the_seeds_every_candidate_ran():
    runs = [seeded("a", 0, -1.0, 0.9), seeded("b", 0, -2.0, 0.8), seeded("c", 0, -3.0, 0.7),  # seed 0: tau +1
            seeded("a", 1, -1.0, 0.7), seeded("b", 1, -2.0, 0.8), seeded("c", 1, -3.0, 0.9),  # seed 1: tau -1
            seeded("a", 2, -1.0, 0.9), seeded("b", 2, -2.0, 0.7), seeded("c", 2, -3.0, 0.8),  # seed 2: tau 1/3
            seeded("a", 3, -1.0, 0.1)]  # seed 3: only one candidate ran it, left out
    (entry,) = ms.rank_candidates(runs, SPEC, seed_keys=("seed",))
    taus = [1.0, -1.0, 1 / 3]
    mean, se, n = entry["per_seed"]["test/acc"]
    assert n == 3 and mean == pytest.approx(sum(taus) / 3)
    assert se == pytest.approx(math.sqrt(sum((t - mean) ** 2 for t in taus) / 2 / 3))
    assert entry["per_seed"]["test/nll"][0] == pytest.approx(mean)  # nll = 1 - acc, lower is better
    text = "\n".join(ms.to_markdown([entry], SPEC))
    assert f"test/acc: {mean:.4f} ± {se:.4f} (n=3)" in text
    (single,) = ms.rank_candidates(runs[:3], SPEC, seed_keys=("seed",))
    assert single["per_seed"]["test/acc"][1:] == (pytest.approx(math.nan, nan_ok=True), 1)


def test_the_evidence_terms_are_shown_where_every_run_records_them():
    def terms(model, seed, log_lik, log_det_ratio, scatter, acc):
        metrics = {"laplace/log_marglik": log_lik - 0.5 * (log_det_ratio + scatter), "laplace/log_lik": log_lik,
                   "laplace/log_det_ratio": log_det_ratio, "laplace/scatter": scatter, "test/acc": acc, "test/nll": 1 - acc}
        return Run(path=None, metrics=metrics,
                   overrides={"data.name": "mnist", "model": model, "method_name": "online", "seed": str(seed)})

    runs = [terms("small", 0, -200.0, 100.0, 50.0, 0.95), terms("small", 1, -210.0, 110.0, 50.0, 0.96),
            terms("wide", 0, -100.0, 300.0, 200.0, 0.97)]
    (entry,) = ms.rank_candidates(runs, SPEC)
    assert entry["terms"] == ["laplace/log_lik", "laplace/log_det_ratio", "laplace/scatter", "occam"]
    assert entry["means"]["occam"] == [pytest.approx(-77.5), pytest.approx(-250.0)]  # small: mean of -75, -80
    assert entry["means"]["laplace/log_lik"] == [-205.0, -100.0]
    for i in range(2):  # the terms add up to the score, candidate by candidate
        assert entry["means"]["laplace/log_lik"][i] + entry["means"]["occam"][i] == pytest.approx(
            entry["means"]["laplace/log_marglik"][i])
    text = "\n".join(ms.to_markdown([entry], SPEC))
    assert "| model | n | laplace/log_marglik | laplace/log_lik | laplace/log_det_ratio | laplace/scatter | occam |" in text
    assert "| small | 2 | -282.5000 | -205.0000 | 105.0000 | 50.0000 | -77.5000 | 0.9550 |" in text
    # one run without the terms (an older run): no terms columns for its group
    runs[0] = run("mnist", "small", "online", **{"laplace/log_marglik": -275.0, "test/acc": 0.95, "test/nll": 0.05})
    runs[0].overrides["seed"] = "0"
    (entry,) = ms.rank_candidates(runs, SPEC)
    assert entry["terms"] == [] and "occam" not in entry["means"]
    assert "laplace/log_lik" not in "\n".join(ms.to_markdown([entry], SPEC))
    # another score (not the Laplace evidence): no terms either
    (entry,) = ms.rank_candidates(runs[1:], {**SPEC, "score": "test/nll"})
    assert entry["terms"] == []


def test_list_override_and_config_list_are_one_candidate():
    # model.widths given as an override (in any spacing) and read from the resolved config are one value.
    def mlp(widths_override, config_widths, score, acc):
        overrides = {"data.name": "mnist", "model": "mlp", "method_name": "online"}
        if widths_override is not None:
            overrides["model.widths"] = widths_override
        return Run(path=None, metrics={"laplace/log_marglik": score, "test/acc": acc, "test/nll": 0.1},
                   overrides=overrides, config={"model": {"widths": config_widths}})

    runs = [mlp("[100,100]", [100, 100], -10.0, 0.9), mlp("[100, 100]", [100, 100], -20.0, 0.8),
            mlp(None, [100, 100], -30.0, 0.7), mlp("[50]", [50], -5.0, 0.95)]
    assert {r.value("model.widths") for r in runs} == {"[100,100]", "[50]"}
    # parsed as Hydra parses overrides: numbers as numbers, text that is no list as written
    as_override = Run(path=None, metrics={}, overrides={"map_grid": "[1e-3, 10]", "bad": "[1,"})
    as_config = Run(path=None, metrics={}, config={"map_grid": [0.001, 10]})
    assert as_override.value("map_grid") == as_config.value("map_grid") == "[0.001,10]"
    assert as_override.value("bad") == "[1,"
    (entry,) = ms.rank_candidates(runs, {**SPEC, "candidates": ["model", "model.widths"]})
    assert [c["model.widths"] for c in entry["candidates"]] == ["[100,100]", "[50]"]
    assert entry["n_runs"] == [3, 1]
