"""Post-hoc Laplace after training, configured by the curvature/, prior/, marglik/ and
predictive/ config groups. Starts from the prior precision and noise the training ended with
(the online-marglik values, if it ran), then tunes the prior as ``marglik.posthoc_prior`` says.
"""

from __future__ import annotations

import time

from omegaconf import DictConfig

from laplace_lab.data.base import LabDataModule
from laplace_lab.laplace import Laplace
from laplace_lab.training.hyperparameters import initial_log_prior
from laplace_lab.training.module import MAPModule


def laplace_kwargs(curvature_cfg: DictConfig) -> dict:
    """Engine arguments of a ``curvature/`` config."""
    kwargs = {
        "subset_of_weights": curvature_cfg.subset_of_weights,
        "hessian_structure": curvature_cfg.hessian_structure,
        "curvature": curvature_cfg.type,
        "n_mc_samples": int(curvature_cfg.n_mc_samples),
    }
    if curvature_cfg.hessian_structure == "lowrank":
        kwargs["n_eigs"] = int(curvature_cfg.get("n_eigs", 100))
    return kwargs


def needs_posthoc_laplace(cfg: DictConfig) -> bool:
    return cfg.predictive.pred_type != "map" or cfg.marglik.mode == "posthoc"


def fit_posthoc_laplace(cfg: DictConfig, module: MAPModule, datamodule: LabDataModule) -> tuple[Laplace, dict]:
    """Fit the configured Laplace at the module's weights; returns it and its summary metrics."""
    start = time.perf_counter()
    sigma = float(module.sigma_noise) if module.likelihood == "regression" else 1.0
    la = Laplace(module.model, module.likelihood, prior_precision=1.0, prior_structure=cfg.prior.structure,
                 sigma_noise=sigma, temperature=module.temperature, seed=cfg.seed, **laplace_kwargs(cfg.curvature))
    la.prior_precision = initial_log_prior(module.prior_precision, module.model, la.params, cfg.prior.structure).exp()
    la.fit(datamodule.train_eval_dataloader(batch_size=cfg.curvature.get("fit_batch_size")))
    tuning = cfg.marglik.get("posthoc_prior", "none")
    if tuning == "marglik":
        la.optimize_prior_precision(method="marglik", n_steps=int(cfg.marglik.get("n_steps", 100)),
                                    lr=float(cfg.marglik.get("lr_hyp", 0.1)),
                                    tune_sigma_noise=module.likelihood == "regression")
    elif tuning == "gridsearch":
        la.optimize_prior_precision(method="gridsearch", val_loader=datamodule.val_dataloader(),
                                    pred_type=cfg.predictive.pred_type, n_samples=int(cfg.predictive.n_samples))
    metrics = {
        "laplace/log_marglik": float(la.log_marginal_likelihood().detach()),
        "laplace/prior_precision_mean": float(la.prior_precision.mean()),
        "laplace/fit_time_s": time.perf_counter() - start,
    }
    if module.likelihood == "regression":
        metrics["laplace/sigma_noise"] = float(la.sigma_noise)
    return la, metrics
