"""Post-hoc Laplace after training, configured by the curvature/, prior/, marglik/ and
predictive/ config groups. Starts from the prior precision and noise the training ended with
(the online-marglik values, if it ran), then tunes the prior as ``marglik.posthoc_prior`` says.

``marglik.evidence_point`` (Antoran et al. 2022, recommendation 1): ``weights`` evaluates the
evidence at the trained weights (the usual Laplace); ``linear_mode`` keeps the trained weights as
the linearisation point but evaluates the evidence at the mode ``theta*`` of the linearised model,
found jointly with the prior precision (``posthoc_prior: marglik``) or at the fixed prior
(``none``) by ``laplace.linear_mode.fit_linear_mode`` (settings ``marglik.linear_mode.*``). The
Laplace's ``glm`` predictive mean is then the linear model's at ``theta*`` and ``nn`` samples
around ``theta*``; the ``map`` predictor stays the network at its weights.
"""

from __future__ import annotations

import logging
import time

import torch
from omegaconf import DictConfig, OmegaConf

from laplace_lab.data.base import LabDataModule
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.linear_mode import fit_linear_mode
from laplace_lab.laplace.spec import structure_class
from laplace_lab.training.hyperparameters import example_input, initial_log_prior
from laplace_lab.training.module import MAPCore

log = logging.getLogger(__name__)
LINEAR_MODE_KEYS = ("n_outer", "tol", "prior_max_iter", "round_newton", "max_newton", "newton_tol", "cg_tol",
                    "cg_max_iter", "chunk_size", "vec_chunk", "solve_subset")


def laplace_kwargs(curvature_cfg: DictConfig) -> dict:
    """Engine arguments of a ``curvature/`` config; the structure's own options (its declared
    ``options``, e.g. lowrank's ``n_eigs``) go as ``structure_options`` when the config sets them."""
    kwargs = {
        "subset_of_weights": curvature_cfg.subset_of_weights,
        "hessian_structure": curvature_cfg.hessian_structure,
        "curvature": curvature_cfg.type,
        "n_mc_samples": int(curvature_cfg.n_mc_samples),
    }
    options = {k: curvature_cfg[k] for k in structure_class(curvature_cfg.hessian_structure).options
               if curvature_cfg.get(k) is not None}
    if options:
        kwargs["structure_options"] = options
    return kwargs


def needs_posthoc_laplace(cfg: DictConfig) -> bool:
    return cfg.predictive.pred_type != "map" or cfg.marglik.mode == "posthoc"


def linear_mode_kwargs(marglik_cfg: DictConfig) -> dict:
    """``fit_linear_mode`` arguments from ``marglik.linear_mode`` (missing keys: its defaults)."""
    given = OmegaConf.to_container(marglik_cfg.get("linear_mode") or {}, resolve=True)
    return {k: v for k, v in given.items() if k in LINEAR_MODE_KEYS and v is not None}


def fit_posthoc_laplace(cfg: DictConfig, module: MAPCore, datamodule: LabDataModule) -> tuple[Laplace, dict]:
    """Fit the configured Laplace at the module's weights; returns it and its summary metrics."""
    start = time.perf_counter()
    sigma = float(module.sigma_noise) if module.likelihood == "regression" else 1.0
    structure = cfg.prior.structure
    la = Laplace(module.model, module.likelihood, prior_precision=1.0, prior_structure=structure,
                 sigma_noise=sigma, temperature=module.temperature, seed=cfg.seed,
                 example_input=example_input(datamodule.input_shape, module.model), **laplace_kwargs(cfg.curvature))
    la.prior_precision = initial_log_prior(module.prior_precision, module.model, la.params, structure,
                                           groups=la.prior_groups).exp()
    loader = datamodule.train_eval_dataloader(batch_size=cfg.curvature.get("fit_batch_size"))
    la.fit(loader)
    log.info("Laplace fit: %s %s %s, %d batches, %.1f s", cfg.curvature.subset_of_weights,
             cfg.curvature.hessian_structure, cfg.curvature.type, len(loader), time.perf_counter() - start)
    tuning = cfg.marglik.get("posthoc_prior", "none")
    metrics = {}
    if cfg.marglik.get("evidence_point", "weights") == "linear_mode":
        data = list(loader)  # held in memory: the solver passes over the training set many times
        res = fit_linear_mode(la, data, optimize_prior=tuning == "marglik", seed=cfg.seed,
                              tune_sigma_noise=tuning == "marglik" and module.likelihood == "regression",
                              **linear_mode_kwargs(cfg.marglik))
        metrics |= {"laplace/linear_mode_rounds": float(res.n_outer), "laplace/linear_mode_converged": float(res.converged),
                    # the final solve: ||grad L(theta*)|| / ||grad L(theta_hat)|| and whether Newton stopped on its test
                    "laplace/linear_mode_grad_residual": res.grad_residual,
                    "laplace/linear_mode_final_converged": float(res.final_solve_converged),
                    "laplace/linear_mode_shift":  # ||theta* - theta_hat|| / ||theta_hat||
                        float(la.linear_offset.norm() / (la.mean - la.linear_offset).norm().clamp_min(1e-12))}
    elif tuning == "marglik":
        la.optimize_prior_precision(method="marglik", n_steps=int(cfg.marglik.get("n_steps", 100)),
                                    lr=float(cfg.marglik.get("lr_hyp", 0.1)),
                                    tune_sigma_noise=module.likelihood == "regression")
    elif tuning == "gridsearch":
        la.optimize_prior_precision(method="gridsearch", val_loader=datamodule.val_dataloader(), grid_size=21,
                                    pred_type=cfg.predictive.pred_type, n_samples=int(cfg.predictive.n_samples))
    with torch.no_grad():  # one log det for the evidence and its terms (full: one Cholesky)
        terms = la.log_marginal_likelihood_terms()
        log_marglik = la.log_marginal_likelihood_from_terms(terms)
    metrics |= {
        "laplace/log_marglik": float(log_marglik),
        # log_marglik = log_lik - 0.5 (log_det_ratio + scatter): the fit and the Occam term apart
        **{f"laplace/{k}": float(v) for k, v in terms.items()},
        "laplace/prior_precision_mean": float(la.prior_precision.mean()),
        "laplace/fit_time_s": time.perf_counter() - start,
    }
    log.info("Laplace prior tuning (%s, evidence at %s): log marglik %.4g, prior precision mean %.4g, %.1f s in all",
             tuning, cfg.marglik.get("evidence_point", "weights"), metrics["laplace/log_marglik"],
             metrics["laplace/prior_precision_mean"], metrics["laplace/fit_time_s"])
    if structure == "normgroups":
        metrics |= {f"laplace/prior_precision/group{g}": float(v) for g, v in enumerate(la.prior_precision)}
    if module.likelihood == "regression":
        metrics["laplace/sigma_noise"] = float(la.sigma_noise)
    return la, metrics
