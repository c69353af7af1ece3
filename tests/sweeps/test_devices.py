"""Device-agnostic runs: ``trainer=gpu`` needs a GPU and says so before any work; the
Laplace fit, its predictive and the evaluation stay on the model's device; every run records its
devices. The CUDA cases run where a GPU exists and are skipped elsewhere."""

from __future__ import annotations

import math

import pytest
import torch

from laplace_lab.sweeps.devices import check_accelerator, device_record
from laplace_lab.sweeps.status import DEVICE_FIELDS, read_devices
from tests.conftest import compose_config, run_config

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch here)")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
TINY = ["data=toy2d", "logger=csv", "evaluation.enabled=true", "trainer.max_epochs=1", "torch_num_threads=1"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a CUDA GPU")
def test_trainer_gpu_without_a_gpu_fails_before_any_work(tmp_path):
    from laplace_lab.train import run

    cfg = compose_config([*TINY, "trainer=gpu"])
    with pytest.raises(ValueError, match=r"trainer.accelerator='gpu' \(trainer=gpu\) asks for a CUDA GPU.*"
                                         r"CUDA_VISIBLE_DEVICES=.*Use trainer=cpu"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written, no data loaded
    check_accelerator(run_config(["trainer=cpu"]).trainer.accelerator)  # CPU and auto pass
    check_accelerator(run_config(["trainer=default"]).trainer.accelerator)


@CUDA
def test_trainer_gpu_asking_for_more_gpus_than_visible_fails():
    cfg = run_config(["trainer=gpu", f"trainer.devices={torch.cuda.device_count() + 1}"])
    with pytest.raises(ValueError, match="asks for more GPUs than visible"):
        check_accelerator(cfg.trainer.accelerator, cfg.trainer.devices)


@pytest.mark.parametrize("device", DEVICES)
def test_run_trains_fits_and_evaluates_on_the_trainer_device(tmp_path, device):
    """A whole run; ``trainer=gpu`` trains on CUDA, and the Laplace fit and the evaluation run there
    too (Lightning moves the module back to the CPU after fit: ``run`` moves it back)."""
    from laplace_lab.train import run

    metrics = run(compose_config([*TINY, f"trainer={'gpu' if device == 'cuda' else 'cpu'}"]), tmp_path)
    devices = read_devices(tmp_path)
    assert set(devices) == set(DEVICE_FIELDS)
    assert devices["accelerator"] == device and devices["torch_device"].startswith(device)
    assert devices["device_ids"] == "0"
    assert math.isfinite(metrics["test/la/nll"]) and math.isfinite(metrics["laplace/log_marglik"])


@pytest.mark.parametrize("device", DEVICES)
def test_laplace_fit_predictive_and_evaluation_keep_the_model_device(tmp_path, device):
    from laplace_lab.evaluation import run_evaluation
    from laplace_lab.training.build import build
    from laplace_lab.training.eval_plan import evaluation_plan
    from laplace_lab.training.posthoc import fit_posthoc_laplace
    from laplace_lab.training.predictors import laplace_predictor, map_predictor

    cfg = run_config([*TINY, "curvature=kron"])
    datamodule, module = build(cfg)
    datamodule.setup("fit")
    module.to(device)
    la, la_metrics = fit_posthoc_laplace(cfg, module, datamodule)
    assert la.mean.device.type == device and la.prior_precision.device.type == device
    assert math.isfinite(la_metrics["laplace/log_marglik"])
    x, _ = next(iter(datamodule.test_dataloader()))
    for predict in (laplace_predictor(la, cfg.predictive), map_predictor(module)):
        probs = predict(x.to(device))
        assert probs.device.type == device and torch.allclose(probs.sum(-1), torch.ones(len(x), device=device))
    metrics = run_evaluation(evaluation_plan(cfg, module, datamodule, la, tmp_path), step=0)
    assert math.isfinite(metrics["test/la/nll"]) and math.isfinite(metrics["test/map/acc"])
    assert next(module.parameters()).device.type == device  # the evaluation left the model where it was


def test_device_record_without_trainer(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no CUDA initialised under this variable
    record = device_record(module=torch.nn.Linear(2, 2))
    assert record["cuda_visible_devices"] == "3" and record["torch_device"] == "cpu"
    assert record["accelerator"] is None and record["device_ids"] is None
