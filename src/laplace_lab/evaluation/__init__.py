"""Evaluation of MAP and Laplace predictives: calibration, OOD, dataset shift, adversarial
robustness, 2-D toy contours; logged to Lightning loggers (wandb, CSV) and to the run directory.

Interfaces (the only things the rest of laplace-lab has to provide)
-------------------------------------------------------------------
Predictor
    A callable on a batch of inputs ``x`` (already on ``device``):
    - classification: ``predictor(x) -> probs [B, C]``, rows summing to 1 (probabilities, not
      logits; checked). Differentiable w.r.t. ``x`` when it supports it (the MAP softmax, a
      Laplace GLM probit predictive, an MC predictive with fixed reparameterised samples); only
      the adversarial attacks on the predictor itself need that.
    - regression: ``predictor(x) -> (mean [B, O], var [B, O])`` in *standardised* target units,
      ``var`` the total predictive variance including observation noise.
    The runner does not switch autograd off (Laplace predictives may need it for Jacobians); it
    detaches outputs and puts every ``nn.Module`` among predictors / attack model in eval mode
    for the duration (restoring the previous mode after).
Data
    ``DataLoader``s yielding ``(x, y)``; images in ``input_range`` (default ``[0, 1]``, no
    normalisation in the data). ``test_loader``; ``ood_loaders: {name: loader}``. Uniform-noise
    and far-away (``alpha * x_test``) OOD inputs and rotated views are generated here.
    CIFAR-10-C is read from ``<data_dir>/CIFAR-10-C/*.npy`` when present (else skipped with the
    reason in ``eval_report.json``). Regression targets come standardised (as the data modules
    give them); ``target_mean`` / ``target_std`` convert to original units.
Attack model
    What FGSM attacks: an ``nn.Module`` returning logits (cross-entropy), or any predictor
    returning probabilities (NLL of the probabilities); see ``adversarial``.
Loggers
    A Lightning logger or a list of them (``trainer.loggers``): scalars go to all of them,
    figures (``wandb.Image``) and tables (``wandb.Table``) to ``WandbLogger``s; the same figures
    (PNG), tables (CSV) and metrics (``eval_metrics.json`` / ``.csv``) always go to ``out_dir``.

Entry point
-----------
``run_evaluation(cfg, task, predictors, test_loader, ood_loaders, attack_model, out_dir,
logger=..., **kw) -> {key: float}`` with keys ``<section>/<view>/<predictor>/<metric>``
(``test/<predictor>/<metric>``); the full key table is in ``runner``'s docstring. Call
``validate_config(cfg.evaluation)`` when the config is composed to fail early on bad values.

Example (``train.py``, after fitting)::

    from laplace_lab.evaluation import run_evaluation, validate_config
    eval_cfg = validate_config(cfg.evaluation)          # at compose time: fail early
    predictors = {"map": lambda x: model(x).softmax(-1),
                  "la": lambda x: la(x, pred_type="glm", link_approx="probit")}
    metrics = run_evaluation(eval_cfg, dm.task, predictors, dm.test_dataloader(),
                             dm.ood_dataloaders(), attack_model=model, out_dir=hydra_run_dir,
                             logger=trainer.loggers, dataset=cfg.data.name,
                             data_dir=cfg.paths.data_dir, input_range=dm.input_range,
                             target_mean=dm.target_mean, target_std=dm.target_std)

Landscape (``evaluation.landscape``, off by default): ``run_evaluation(..., landscape=
LandscapeInputs(la, train_set, test_set))`` draws the loss around the MAP beside the fitted
Laplace's Gaussian (``landscape``, ``landscape_plots``, ``landscape_html``).

Modules: ``config`` (validation), ``metrics`` (each declared once in ``metric_registry``), ``predict`` (running predictors), ``ood``,
``shift``, ``adversarial``, ``toy2d``, ``plots``, ``landscape`` (+ ``_plots``, ``_html``),
``report`` (loggers and files), ``runner``.
"""

from laplace_lab import lazy_attributes
from laplace_lab.evaluation.config import EvalConfig, validate_config

__all__ = ["EvalConfig", "metric_key", "run_evaluation", "toy2d_contours", "validate_config"]
# ``runner`` / ``toy2d`` names on first use (they import pandas and matplotlib)
__getattr__ = lazy_attributes(__name__, {"metric_key": "laplace_lab.evaluation.runner",
                                         "run_evaluation": "laplace_lab.evaluation.runner",
                                         "toy2d_contours": "laplace_lab.evaluation.toy2d"})
