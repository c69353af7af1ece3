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

import dataclasses
import logging
import time

import torch

from laplace_lab.config.schema import RunConfig
from laplace_lab.data.base import LabDataModule
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.linear_mode import fit_linear_mode
from laplace_lab.training.fit_batch import fit_batch_size
from laplace_lab.training.hyperparameters import example_input, initial_log_prior
from laplace_lab.training.module import MAPCore

log = logging.getLogger(__name__)


def fit_posthoc_laplace(run: RunConfig, module: MAPCore, datamodule: LabDataModule) -> tuple[Laplace, dict]:
    """Fit the configured Laplace at the module's weights; returns it and its summary metrics."""
    start = time.perf_counter()
    sigma = float(module.sigma_noise) if module.likelihood == "regression" else 1.0
    structure, c, marglik = run.prior.structure, run.curvature, run.marglik
    la = Laplace(module.model, module.likelihood, prior_precision=1.0, prior_structure=structure,
                 sigma_noise=sigma, temperature=module.temperature, seed=run.seed,
                 example_input=example_input(datamodule.input_shape, module.model), **c.laplace_kwargs(),
                 process_group=None)  # its loader is the whole training set on every rank: nothing to sum
    la.prior_precision = initial_log_prior(module.prior_precision, module.model, la.params, structure,
                                           groups=la.prior_groups).exp()
    loader = datamodule.train_eval_dataloader(batch_size=fit_batch_size(c.fit_batch_size, datamodule, la)[0])
    la.fit(loader)
    log.info("Laplace fit: %s %s %s, %d batches, %.1f s", c.subset_of_weights, c.hessian_structure, c.type,
             len(loader), time.perf_counter() - start)
    tuning = marglik.posthoc_prior
    metrics = {}
    if marglik.evidence_point == "linear_mode":
        data = list(loader)  # held in memory: the solver passes over the training set many times
        res = fit_linear_mode(la, data, optimize_prior=tuning == "marglik", seed=run.seed,
                              tune_sigma_noise=tuning == "marglik" and module.likelihood == "regression",
                              **{k: v for k, v in dataclasses.asdict(marglik.linear_mode).items() if v is not None})
        metrics |= {"laplace/linear_mode_rounds": float(res.n_outer), "laplace/linear_mode_converged": float(res.converged),
                    # the final solve: ||grad L(theta*)|| / ||grad L(theta_hat)|| and whether Newton stopped on its test
                    "laplace/linear_mode_grad_residual": res.grad_residual,
                    "laplace/linear_mode_final_converged": float(res.final_solve_converged),
                    "laplace/linear_mode_shift":  # ||theta* - theta_hat|| / ||theta_hat||
                        float(la.linear_offset.norm() / (la.mean - la.linear_offset).norm().clamp_min(1e-12))}
    elif tuning == "marglik":
        la.optimize_prior_precision(method="marglik", n_steps=int(marglik.n_steps), lr=float(marglik.lr_hyp),
                                    tune_sigma_noise=module.likelihood == "regression")
    elif tuning == "gridsearch":
        la.optimize_prior_precision(method="gridsearch", val_loader=datamodule.val_dataloader(), grid_size=21,
                                    pred_type=run.predictive.pred_type, n_samples=int(run.predictive.n_samples))
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
             tuning, marglik.evidence_point, metrics["laplace/log_marglik"],
             metrics["laplace/prior_precision_mean"], metrics["laplace/fit_time_s"])
    if structure == "normgroups":
        metrics |= {f"laplace/prior_precision/group{g}": float(v) for g, v in enumerate(la.prior_precision)}
    if module.likelihood == "regression":
        metrics["laplace/sigma_noise"] = float(la.sigma_noise)
    return la, metrics
