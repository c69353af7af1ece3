"""``evaluation_plan``: what a trained run evaluates (``evaluation.EvaluationPlan``), from its typed
config, the trained module, the data module and the post-hoc Laplace."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from laplace_lab.config.schema import RunConfig
from laplace_lab.data.base import LabDataModule
from laplace_lab.evaluation.labels import run_label
from laplace_lab.evaluation.plan import EvalData, EvaluationPlan, LandscapeInputs, TargetUnits
from laplace_lab.io.eta import attached_to_terminal
from laplace_lab.training.module import MAPCore
from laplace_lab.training.predictors import (
    het_approx_alternatives,
    laplace_predictor,
    map_predictor,
)


def evaluation_plan(job: RunConfig, module: MAPCore, datamodule: LabDataModule, la, output_dir: Path,
                    extra_predictors: dict | None = None, swept: Sequence[str] = ()) -> EvaluationPlan:
    """MAP and (if fitted) Laplace predictives side by side, on the data module's test and OOD rows;
    ``extra_predictors`` (e.g. the ensemble's ``de`` / ``mola``) beside them. FGSM attacks
    ``module.model`` (for an ensemble: member 0). Progress bars only on a terminal (else one line per
    section). ``swept``: a multirun job's ``key=value`` overrides, named in its figure titles."""
    predictors = {"map": map_predictor(module)}
    if la is not None:
        predictors["la"] = laplace_predictor(la, job.predictive)
        predictors.update(het_approx_alternatives(la, job.predictive))
    predictors.update(extra_predictors or {})
    task = "classification" if module.likelihood == "classification" else "regression"
    is_toy2d = task == "classification" and tuple(datamodule.input_shape) == (2,)
    config = job.evaluation
    if config.progress and not attached_to_terminal():
        config = dataclasses.replace(config, progress=False)
    data = EvalData(
        datamodule.test_dataloader(), datamodule.ood_dataloaders(), dataset=getattr(datamodule, "name", None),
        data_dir=job.paths.data_dir, input_range=datamodule.input_range,
        toy_data=datamodule.train_set.tensors if is_toy2d else None,
        targets=TargetUnits(datamodule.target_mean if datamodule.target_mean is not None else 0.0,
                            datamodule.target_std if datamodule.target_std is not None else 1.0))
    landscape = None  # the loss landscape around the MAP beside la's Gaussian (evaluation.landscape)
    if la is not None and config.landscape.enabled:
        landscape = LandscapeInputs(la, datamodule.train_set, datamodule.test_set)
    return EvaluationPlan(config, task, predictors, data, attack_model=module.model, landscape=landscape,
                          out_dir=output_dir, label=run_label(job.raw, module.likelihood, job.needs_posthoc_laplace, swept))
