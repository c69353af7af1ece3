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
``run_evaluation(plan, logger=..., step=..., device=..., on_eta=...) -> {key: float}`` with keys
``<section>/<view>/<predictor>/<metric>`` (``test/<predictor>/<metric>``); the full key table is in
``runner``'s docstring. ``plan`` is an ``EvaluationPlan`` (``plan``): the options (an ``EvalConfig``,
declared with their defaults and ranges in ``evaluation.options`` and checked when the
run's config is read), the task, the predictors, the rows (``EvalData``) and the output folder.

Example (``training.eval_plan.evaluation_plan`` builds a run's plan)::

    from laplace_lab.evaluation.options import evaluation_config
    from laplace_lab.evaluation import EvalData, EvaluationPlan, run_evaluation
    predictors = {"map": lambda x: model(x).softmax(-1),
                  "la": lambda x: la(x, pred_type="glm", link_approx="probit")}
    data = EvalData(dm.test_dataloader(), dm.ood_dataloaders(), dataset="mnist",
                    input_range=dm.input_range)
    plan = EvaluationPlan(evaluation_config({"n_bins": 10}), "classification", predictors, data,
                          attack_model=model, out_dir=run_dir)
    metrics = run_evaluation(plan, logger=trainer.loggers)

Landscape (``evaluation.landscape``, off by default): ``EvaluationPlan(..., landscape=
LandscapeInputs(la, train_set, test_set))`` draws the loss around the MAP beside the fitted
Laplace's Gaussian (``landscape``, ``landscape_plots``, ``landscape_html``).

Modules: ``plan`` (what to evaluate), ``metrics`` (each declared once in ``metric_registry``),
``predict`` (running predictors), ``ood``, ``shift``, ``adversarial``, ``toy2d``, ``plots``,
``landscape`` (+ ``_plots``, ``_html``), ``report`` (loggers and files), ``runner``.
"""

from laplace_lab import lazy_attributes
from laplace_lab.evaluation.options import EvalConfig, evaluation_config
from laplace_lab.evaluation.plan import EvalData, EvaluationPlan, LandscapeInputs, TargetUnits

__all__ = ["EvalConfig", "EvalData", "EvaluationPlan", "LandscapeInputs", "TargetUnits", "evaluation_config",
           "metric_key", "run_evaluation", "toy2d_contours"]
# ``runner`` / ``toy2d`` names on first use (they import pandas and matplotlib)
__getattr__ = lazy_attributes(__name__, {"metric_key": "laplace_lab.evaluation.runner",
                                         "run_evaluation": "laplace_lab.evaluation.runner",
                                         "toy2d_contours": "laplace_lab.evaluation.toy2d"})
