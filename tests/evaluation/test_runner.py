"""End to end: run_evaluation on tiny data, logged to CSV and offline wandb, files in out_dir."""

import csv
import json
from pathlib import Path

import pytest
import torch
from eval_helpers import read_wandb_keys, write_fake_cifar10c
from pytorch_lightning.loggers import CSVLogger, WandbLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from laplace_lab.evaluation import (
    EvalData,
    EvaluationPlan,
    TargetUnits,
    run_evaluation,
    toy2d_contours,
)
from laplace_lab.evaluation.options import evaluation_config
from laplace_lab.evaluation.predict import eval_mode

SMALL = {
    "n_bins": 10,
    "progress": False,
    "ood": {"n_generated": 64},
    "shift": {"rotation": {"angles": [0, 90]}},
    "adversarial": {
        "enabled": True,
        "epsilons": [0.0, 0.3],
        "attack_laplace": True,
        "confmax": {"epsilons": [0.0, 0.1], "steps": 3, "n_samples": 32},
    },
}


def _plan(cfg, task, predictors, test_loader, attack_model=None, out_dir=".", **data) -> EvaluationPlan:
    """A plan from a dict of options; ``data``: the other ``EvalData`` fields."""
    return EvaluationPlan(evaluation_config(cfg), task, predictors, EvalData(test_loader, **data),
                          attack_model=attack_model, out_dir=out_dir)


def _png_ok(path):
    return path.exists() and path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_full_classification_run_logs_everywhere(tmp_path, image_setup):
    model, predictors, test_loader, ood_loaders = image_setup
    csv_logger = CSVLogger(tmp_path / "csv", name="run")
    wandb_logger = WandbLogger(save_dir=str(tmp_path), offline=True, mode="offline", project="laplace-lab-test")
    out = tmp_path / "out"
    plan = _plan(SMALL, "classification", predictors, test_loader, model, out, ood_loaders=ood_loaders,
                 dataset="toy_images")
    metrics = run_evaluation(plan, logger=[csv_logger, wandb_logger])
    run_dir = wandb_logger.experiment.dir
    wandb_logger.experiment.finish()

    expected = [
        "test/map/acc", "test/la/nll", "test/la/brier", "test/map/ece", "test/la/mce", "test/map/conf",
        "test/la/entropy", "ood/uniform_ood/la/auroc", "ood/noise/map/conf", "ood/far_away/la/fpr95",
        "shift/rot_0/map/acc", "shift/rot_90/la/ece", "fgsm_map/eps_0/map/acc",
        "fgsm_map/eps_0.3/la/entropy", "fgsm_self/eps_0.3/la/acc", "confmax_map/eps_0.1/la/conf",
        "confmax_self/eps_0.1/map/conf", "confmax_self/eps_0/la/entropy",
    ]
    assert not set(expected) - set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    # sanity of the numbers on this easy task
    assert metrics["test/map/acc"] > 0.9
    assert metrics["test/la/conf"] < metrics["test/map/conf"]  # the tempered stand-in is less sure
    assert metrics["fgsm_map/eps_0/map/acc"] == pytest.approx(metrics["test/map/acc"])
    assert metrics["shift/rot_0/la/nll"] == pytest.approx(metrics["test/la/nll"])
    assert metrics["fgsm_map/eps_0.3/map/acc"] < metrics["fgsm_map/eps_0/map/acc"]
    assert metrics["confmax_self/eps_0.1/map/conf"] > metrics["confmax_self/eps_0/map/conf"]
    assert metrics["ood/far_away/map/conf"] > 0.99  # ReLU net far from the data

    # figures (PNG, non-empty) and tables (CSV) in out_dir
    figures = ["reliability", "confidence_hist", "shift_rotation", "fgsm_map", "fgsm_self", "confmax"]
    for name in figures:
        assert _png_ok(out / "figures" / f"{name}.png"), name
        assert (out / "tables" / f"{name if name != 'confidence_hist' else 'ood'}.csv").stat().st_size > 0
    with open(out / "tables" / "reliability.csv") as f:
        header = next(csv.reader(f))
    assert header == ["predictor", "bin_center", "accuracy", "confidence", "count"]
    saved = {k: float(v) for k, v in json.loads((out / "eval_metrics.json").read_text()).items()}  # nan as "nan"
    assert saved == pytest.approx(metrics, nan_ok=True)
    with open(out / "eval_metrics.csv") as f:
        rows = {r["key"]: float(r["value"]) for r in csv.DictReader(f)}
    assert rows == pytest.approx(metrics, nan_ok=True)
    report = json.loads((out / "eval_report.json").read_text())
    assert "shift/cifar10c" in report["skipped"] and set(figures) <= set(report["figures"])

    # every metric in the CSVLogger's metrics.csv ...
    with open(csv_logger.log_dir + "/metrics.csv") as f:
        csv_keys = set(next(csv.reader(f)))
    assert not set(metrics) - csv_keys
    # ... and in the offline wandb run, with figures as images and the reliability table
    wandb_keys = read_wandb_keys(run_dir.rsplit("/files", 1)[0])
    assert not set(metrics) - wandb_keys
    assert {f"figures/{n}" for n in figures} | {"tables/reliability", "tables/fgsm_map"} <= wandb_keys
    (table_file,) = Path(run_dir).glob("media/table/tables/reliability_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["predictor", "bin_center", "accuracy", "confidence", "count"]
    assert len(table["data"]) == 2 * 10  # predictors x bins


def test_regression_run(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=g)
    y = (x @ torch.tensor([[1.0], [-0.5], [0.2]]) + 0.3 * torch.randn(200, 1, generator=g))
    sd = float(y.std())
    ys = (y - y.mean()) / sd
    w = torch.linalg.lstsq(x, ys).solution

    def good(z):
        return z @ w, torch.full((len(z), 1), 0.3**2 / sd**2)

    def overconfident(z):
        return z @ w, torch.full((len(z), 1), 1e-3)

    loader = DataLoader(TensorDataset(x, ys), batch_size=64)
    plan = _plan({"progress": False}, "regression", {"map": overconfident, "la": good}, loader, out_dir=tmp_path,
                 targets=TargetUnits(float(y.mean()), sd))
    metrics = run_evaluation(plan, logger=CSVLogger(tmp_path / "csv"))
    names = ("ll", "rmse", "cov_50", "cov_90", "cov_95")
    assert set(metrics) == {f"test/{p}/{m}" for p in ("map", "la") for m in names} | {f"noise/test/{m}" for m in names}
    assert metrics["noise/test/ll"] > 0 and metrics["noise/test/rmse"] == 0.0  # same means: no RMSE difference
    assert metrics["test/la/rmse"] == pytest.approx(0.3, rel=0.25)  # original units
    assert metrics["test/la/cov_95"] > 0.85 and metrics["test/map/cov_95"] < 0.3
    assert metrics["test/la/ll"] > metrics["test/map/ll"]
    assert _png_ok(tmp_path / "figures" / "regression_coverage.png")


def test_toy2d_run(tmp_path):
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    y = torch.randint(0, 3, (150,), generator=g)
    X = centres[y] + 0.5 * torch.randn(150, 2, generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(100):
        opt.zero_grad()
        nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
    preds = {"map": lambda z: torch.softmax(net(z), -1), "la": lambda z: torch.softmax(net(z) / 50, -1)}
    cfg = {"progress": False, "toy2d": {"enabled": True, "resolution": 25}}
    metrics = run_evaluation(_plan(cfg, "classification", preds, DataLoader(TensorDataset(X, y), batch_size=50),
                                   net, tmp_path, input_range=None, toy_data=(X, y)))
    for name in ("toy2d_zoom_in", "toy2d_zoom_out", "reliability", "confidence_hist"):
        assert _png_ok(tmp_path / "figures" / f"{name}.png"), name
    assert metrics["toy2d/far/map/conf"] > 0.95 > metrics["toy2d/far/la/conf"]
    report = json.loads((tmp_path / "eval_report.json").read_text())
    assert "inputs are not images" in report["skipped"]["shift/rotation"]
    assert "unbounded" in report["skipped"]["ood/noise"]


def test_cifar10c_through_runner(tmp_path):
    write_fake_cifar10c(tmp_path / "data", corruptions=("fog", "snow"), per_severity=6)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    preds = {"map": lambda z: torch.softmax(net(z), -1)}
    test = DataLoader(TensorDataset(torch.rand(20, 3, 32, 32), torch.randint(0, 10, (20,))), batch_size=10)
    cfg = {"progress": False, "ood": {"enabled": False}, "shift": {"rotation": {"enabled": False},
                                                                   "cifar10c": {"severities": [1, 5]}}}
    metrics = run_evaluation(_plan(cfg, "classification", preds, test, out_dir=tmp_path / "out", dataset="CIFAR-10",
                                   data_dir=str(tmp_path / "data")))
    assert {"shift/c10c_s1/map/acc", "shift/c10c_s5/map/ece"} <= set(metrics)
    assert _png_ok(tmp_path / "out" / "figures" / "shift_cifar10c.png")
    with open(tmp_path / "out" / "tables" / "shift_cifar10c.csv") as f:
        assert len(list(csv.DictReader(f))) == 2 * 2  # corruptions x severities
    # without the files: skipped with the reason, no error
    out2 = tmp_path / "out2"
    run_evaluation(_plan(cfg, "classification", preds, test, out_dir=out2, dataset="cifar10", data_dir=str(tmp_path)))
    reason = json.loads((out2 / "eval_report.json").read_text())["skipped"]["shift/cifar10c"]
    assert "CIFAR-10-C not found" in reason


def test_disabled_evaluation_writes_report(tmp_path, image_setup):
    _, predictors, test_loader, _ = image_setup
    assert run_evaluation(_plan({"enabled": False}, "classification", predictors, test_loader, out_dir=tmp_path)) == {}
    assert json.loads((tmp_path / "eval_report.json").read_text())["skipped"]["all"]


def test_bad_inputs_raise(tmp_path, image_setup):
    model, predictors, test_loader, _ = image_setup
    with pytest.raises(ValueError, match=r"task='segmentation' is not supported; allowed: \['classification', 'regression'\]"):
        _plan({}, "segmentation", predictors, test_loader, out_dir=tmp_path)
    with pytest.raises(ValueError, match="at least one predictor"):
        _plan({}, "classification", {}, test_loader, out_dir=tmp_path)
    with pytest.raises(ValueError, match=r"input_range=\(1, 0\) is not supported; allowed: \(low, high\) with low < high"):
        _plan({}, "classification", predictors, test_loader, input_range=(1, 0))
    with pytest.raises(TypeError, match="must be an EvalConfig"):
        EvaluationPlan({"n_bins": 10}, "classification", predictors, EvalData(test_loader))
    with pytest.raises(ValueError, match="predictor 'logits'.*not logits"):
        run_evaluation(_plan({"progress": False}, "classification", {"logits": model}, test_loader, out_dir=tmp_path))
    with pytest.raises(ValueError, match=r"evaluation\.n_bins"):
        evaluation_config({"n_bins": 0})


def test_toy2d_contours_needs_2d_inputs():
    with pytest.raises(ValueError, match=r"2-D inputs \[N, 2\]"):
        toy2d_contours({"p": lambda z: torch.softmax(z[:, :2], -1)}, torch.rand(5, 3), torch.zeros(5))


def test_eval_mode_restores_training_flag():
    net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with eval_mode(net, lambda x: x):
        assert not net.training
    assert net.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda(tmp_path, image_data):
    from eval_helpers import TemperedSoftmax, make_mlp

    train, test = image_data
    model = make_mlp(0, train).cuda()
    predictors = {"map": lambda x: torch.softmax(model(x), -1), "la": TemperedSoftmax(model)}
    plan = _plan(SMALL, "classification", predictors, DataLoader(test, batch_size=32), model, tmp_path)
    metrics = run_evaluation(plan)  # device inferred from the model's parameters
    assert metrics["test/map/acc"] > 0.9 and "fgsm_self/eps_0.3/la/acc" in metrics
