"""``run_evaluation``: every evaluation of one run, logged and written to the output directory.

Metric keys are ``<section>/<view>/<predictor>/<metric>`` (``test`` has no view):

====================  ================================  =========================================
section               view                              metrics
====================  ================================  =========================================
``test``              (none)                            acc nll brier ece mce conf entropy;
                                                        regression: ll rmse cov_50 cov_90 cov_95
``ood``               OOD set name, ``noise``,          conf entropy auroc fpr95
                      ``far_away``
``shift``             ``rot_<deg>``, ``c10c_s<k>``      acc nll brier ece mce conf entropy
                      (CIFAR-10-C severity k, mean
                      over corruptions)
``fgsm_map``          ``eps_<eps>``                     acc nll brier ece mce conf entropy
``fgsm_self``         ``eps_<eps>``                     (same; each predictor attacked itself)
``confmax_map``       ``eps_<eps>``                     conf entropy
``confmax_self``      ``eps_<eps>``                     conf entropy
``toy2d``             ``far``                           conf (mean on the zoomed-out border)
``landscape``         (none); ``d<i>`` (direction i)    ``map/loss``, ``map/acc`` (regression
                                                        ``map/rmse``), ``la/tv``; ``d<i>/la/``
                                                        ``curvature_ratio``, ``offset_std``
                                                        (``landscape.metric_keys``)
====================  ================================  =========================================

With both a ``map`` and an ``la`` predictor, ``noise/<key less the predictor>`` (``noise/test/nll``,
``noise/ood/far_away/auroc``, ``noise/toy2d/far/conf``; test, OOD and toy2d sections) is the
standard error of la - map over the points (``evaluation.noise``), which the console summary
(``evaluation.summary``) compares each difference with.

Numbers in views use ``format(v, "g")``: ``rot_30``, ``eps_0.05``. E.g. ``test/la/ece``,
``ood/fashion_mnist/la/auroc``, ``shift/rot_30/map/acc``, ``fgsm_map/eps_0.1/la/conf``.
``fgsm_map`` / ``confmax_map`` attack ``attack_model`` (the MAP network) and evaluate every
predictor on the same inputs; ``*_self`` attack each predictor itself
(``evaluation.adversarial.attack_laplace=true``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from laplace_lab.evaluation import metrics as M
from laplace_lab.evaluation import plots
from laplace_lab.evaluation.adversarial import (
    NotDifferentiableError,
    ProgressBar,
    confidence_max_attack,
    fgsm_sweep,
)
from laplace_lab.evaluation.noise import (
    classification_noise,
    mean_noise,
    noise_key,
    ood_noise,
    regression_noise,
)
from laplace_lab.evaluation.ood import far_away, uniform_noise
from laplace_lab.evaluation.plan import EvaluationPlan
from laplace_lab.evaluation.predict import (
    eval_mode,
    limit,
    n_batches,
    predict_probs,
    run_predictors,
)
from laplace_lab.evaluation.report import Reporter
from laplace_lab.evaluation.shift import cifar10c_status, load_cifar10c, rotated_batches
from laplace_lab.evaluation.summary import LAPLACE, MAP
from laplace_lab.evaluation.timing import EvalTimer
from laplace_lab.evaluation.toy2d import ContourGrid, toy2d_contours

log = logging.getLogger(__name__)

CURVE_METRICS = ("acc", "nll", "ece", "conf")
ADV_METRICS = ("acc", "conf", "ece", "entropy")


def metric_key(section: str, view: str | None, predictor: str, metric: str) -> str:
    parts = [section] + ([view] if view else []) + [predictor, metric]
    return "/".join(parts)


def _num(v: float) -> str:
    return format(float(v), "g")


def _prefixed(section, view, predictor, values: dict[str, float]) -> dict[str, float]:
    return {metric_key(section, view, predictor, k): v for k, v in values.items()}


def _default_device(attack_model, predictors) -> torch.device:
    for obj in [attack_model, *predictors.values()]:
        if isinstance(obj, nn.Module):
            for p in obj.parameters():
                return p.device
    return torch.device("cpu")


def _norm_name(name: str | None) -> str:
    return (name or "").lower().replace("-", "").replace("_", "")


class _Context:
    """What every section needs; built once by ``run_evaluation``. ``cfg``: the plan's options."""

    def __init__(self, plan: EvaluationPlan, rep: Reporter, device, on_eta: Callable[[float | None], None] | None):
        self.cfg, self.predictors, self.data = plan.config, plan.predictors, plan.data
        self.attack_model, self.landscape = plan.attack_model, plan.landscape
        self.rep, self.device, self.on_eta = rep, device, on_eta  # on_eta: the evaluation's ETA (run_evaluation)
        self.input_range = plan.input_range()
        self.rng = torch.Generator().manual_seed(plan.config.seed)

    def batches(self, loader, max_batches=None):
        mb = max_batches if max_batches is not None else self.cfg.max_test_batches
        return limit(loader, mb), n_batches(loader, mb)

    def probs(self, batches_total, desc, predictors=None, keep_inputs=0, inner=False):
        """Probabilities over loader batches; ``inner=True`` inside an outer progress bar (no bar)."""
        batches, total = batches_total
        return run_predictors(predictors or self.predictors, batches, "classification", self.device,
                              keep_inputs=keep_inputs, desc=desc, progress=self.cfg.progress and not inner,
                              total=total)

    def probs_of(self, x: Tensor, desc: str, predictors=None) -> dict[str, Tensor]:
        """Probabilities on an in-memory tensor (generated inputs; no progress bar)."""
        return predict_probs(predictors or self.predictors, x, self.cfg.chunk_size, self.device, desc, False)


def run_evaluation(plan: EvaluationPlan, logger: Any = None, *, step: int | None = None,
                   device: str | torch.device | None = None,
                   on_eta: Callable[[float | None], None] | None = None) -> dict[str, float]:
    """Evaluate every predictor of ``plan``; log to ``logger`` (one Lightning logger or a list) and
    write into ``plan.out_dir``.

    Args:
        plan: what to evaluate (``plan.EvaluationPlan``: options, task, predictors, rows, output dir).
        logger: Lightning logger(s) that receive the scalars (wandb ones also figures and tables).
        step: step passed to the loggers.
        device: where inputs are sent (default: the device of the first ``nn.Module`` parameter).
        on_eta: receives the estimated seconds the evaluation has left (``timing.EvalTimer``).

    Returns the flat dict of scalar metrics (also in ``<out_dir>/eval_metrics.json``).
    """
    cfg = plan.config
    rep = Reporter(plan.out_dir, logger, step, label=plan.label)
    if not cfg.enabled:
        rep.skip("all", "evaluation.enabled=false", warn=False)
        return rep.finalize(dataclasses.asdict(cfg))
    device = torch.device(device) if device is not None else _default_device(plan.attack_model, plan.predictors)
    ctx = _Context(plan, rep, device, on_eta)
    try:
        with eval_mode(plan.attack_model, *plan.predictors.values()):
            if plan.task == "regression":
                _regression(ctx)
            else:
                _classification(ctx)
            _landscape(ctx)
    finally:
        result = rep.finalize(dataclasses.asdict(cfg))
    return result


# ============================================================================ classification
def _loader_inputs(loader, max_batches: int | None) -> int:
    """Inputs a pass over ``loader`` (at most ``max_batches`` batches) predicts; 0 if unknown."""
    try:
        n = len(loader.dataset)
    except (AttributeError, TypeError):
        return 0
    return n if max_batches is None or loader.batch_size is None else min(n, max_batches * loader.batch_size)


def _timer(ctx: _Context, kept, n_test: int) -> EvalTimer:
    """The sections still to run after the test pass, with the inputs each predicts (``EvalTimer``)."""
    cfg, data, planned, other = ctx.cfg, ctx.data, {}, []
    ood_loaders = data.ood_loaders or {}
    if cfg.ood.enabled:
        names = list(ood_loaders) if cfg.ood.datasets is None else list(cfg.ood.datasets)
        mb = cfg.ood.max_batches if cfg.ood.max_batches is not None else cfg.max_test_batches
        planned["ood"] = sum(_loader_inputs(ood_loaders[n], mb) for n in names if n in ood_loaders)
        if not planned["ood"] and (cfg.ood.noise or cfg.ood.far_away):
            other.append("ood")
    rc = cfg.shift.rotation
    if rc.enabled and kept is not None and kept.ndim == 4:
        mb = rc.max_batches if rc.max_batches is not None else cfg.max_test_batches
        planned["rotation"] = len(rc.angles) * (_loader_inputs(data.test_loader, mb) or n_test)
    c = cfg.shift.cifar10c
    if c.enabled and _norm_name(data.dataset) == "cifar10":
        present, _ = cifar10c_status(c.data_dir or data.data_dir, c.corruptions)
        planned["cifar10c"] = len(present or []) * len(c.severities) * (c.max_items or 10000)
    if cfg.reliability_diagram:
        other.insert(0, "reliability diagram")
    if cfg.adversarial.enabled:
        other.append("adversarial")
    if cfg.toy2d.enabled and data.toy_data is not None:
        other.append("toy2d")
    return EvalTimer(planned, other, on_eta=ctx.on_eta)


def _classification(ctx: _Context):
    cfg, rep = ctx.cfg, ctx.rep
    keep = max(cfg.ood.n_generated, 1)
    start = time.monotonic()
    probs, y, kept = ctx.probs(ctx.batches(ctx.data.test_loader), "test", keep_inputs=keep)
    timer = _timer(ctx, kept, len(y))
    timer.test_done(time.monotonic() - start, len(y))
    n_classes = next(iter(probs.values())).shape[1]
    bins, ece = [], {}
    if MAP in probs and LAPLACE in probs:  # evaluation.noise: how much of la - map the summary may call a change
        rep.add_metrics({noise_key("test", k): v for k, v in classification_noise(probs[MAP], probs[LAPLACE], y,
                                                                                  cfg.n_bins).items()})
    for name, p in probs.items():
        m = M.classification_metrics(p, y, cfg.n_bins, section="test")
        ece[name] = m["ece"]
        rep.add_metrics(_prefixed("test", None, name, m))
        b = M.calibration_bins(p, y, cfg.n_bins)
        bins.append(pd.DataFrame({"predictor": name, **{k: v.numpy() for k, v in b.items()}}))
    if cfg.reliability_diagram:
        with timer.section("reliability diagram"):
            df = pd.concat(bins, ignore_index=True)
            rep.add_table("reliability", df)
            rep.add_figure("reliability", plots.reliability_diagram(df, ece, f"reliability on the test set ({cfg.n_bins} bins)"))

    with timer.section("ood"):
        _ood(ctx, probs, kept)
    with timer.section("rotation"):
        _rotation(ctx, kept)
    with timer.section("cifar10c"):
        _cifar10c(ctx)
    with timer.section("adversarial"):
        _adversarial(ctx, kept)
    with timer.section("toy2d"):
        _toy2d(ctx, n_classes)


def _ood(ctx: _Context, probs_in, kept):
    cfg, rep = ctx.cfg, ctx.rep
    ood_loaders, dataset = ctx.data.ood_loaders or {}, ctx.data.dataset
    if not cfg.ood.enabled:
        rep.skip("ood", "evaluation.ood.enabled=false", warn=False)
        return
    sets: dict[str, dict[str, Tensor]] = {}
    names = list(ood_loaders) if cfg.ood.datasets is None else list(cfg.ood.datasets)
    clash = [n for n, on in (("noise", cfg.ood.noise), ("far_away", cfg.ood.far_away)) if on and n in names]
    if clash:
        raise ValueError(f"OOD loader name(s) {clash} clash with the generated OOD sets; rename the loaders "
                         "or set evaluation.ood.noise / evaluation.ood.far_away to false")
    for name in names:
        if name not in ood_loaders:
            rep.skip(f"ood/{name}", f"no loader for OOD set {name!r} (given: {sorted(ood_loaders)})")
            continue
        sets[name], _, _ = ctx.probs(ctx.batches(ood_loaders[name], cfg.ood.max_batches), f"ood/{name}")
    n = min(cfg.ood.n_generated, len(kept))
    if cfg.ood.noise:
        if ctx.input_range is None:
            rep.skip("ood/noise", "inputs are unbounded (input_range is None): no range to draw noise from", warn=False)
        else:
            x = uniform_noise(cfg.ood.n_generated, tuple(kept.shape[1:]), ctx.input_range, ctx.rng)
            sets["noise"] = ctx.probs_of(x, "ood/noise")
    if cfg.ood.far_away:
        sets["far_away"] = ctx.probs_of(far_away(kept[:n], cfg.ood.far_away_alpha), "ood/far_away")
    if not sets:
        rep.skip("ood", "no OOD sets (no loaders given and generated sets off)")
        return
    rows, conf_rows = [], []
    in_name = dataset or "in-distribution"
    captions = {in_name: "test set" if dataset is None else f"{dataset} test set", "far_away": plots.OOD_CAPTIONS["far_away"].format(
        alpha=f"{cfg.ood.far_away_alpha:g}"), "noise": plots.OOD_CAPTIONS["noise"]}
    captions |= {n: f"{n} (OOD data set)" for n in sets if n not in captions}
    for pname, p_in in probs_in.items():
        conf_rows.append(pd.DataFrame({"predictor": pname, "dataset": in_name,
                                       "confidence": M.confidence(p_in).numpy()}))
    for set_name, by_pred in sets.items():
        for pname, p_out in by_pred.items():
            m = M.ood_metrics(probs_in[pname], p_out)
            rep.add_metrics(_prefixed("ood", set_name, pname, m))
            rows.append({"dataset": set_name, "predictor": pname, **m})
            conf_rows.append(pd.DataFrame({"predictor": pname, "dataset": set_name,
                                           "confidence": M.confidence(p_out).numpy()}))
        if MAP in by_pred and LAPLACE in by_pred and MAP in probs_in and LAPLACE in probs_in:
            noise = ood_noise(probs_in[MAP], probs_in[LAPLACE], by_pred[MAP], by_pred[LAPLACE])
            rep.add_metrics({noise_key("ood", set_name, k): v for k, v in noise.items()})
    rep.add_table("ood", pd.DataFrame(rows))
    n_classes = next(iter(probs_in.values())).shape[1]
    rep.add_figure("confidence_hist", plots.confidence_histograms(
        pd.concat(conf_rows, ignore_index=True), "max confidence: test set against OOD sets", captions, n_classes))


def _rotation(ctx: _Context, kept):
    cfg, rep = ctx.cfg, ctx.rep
    rc = cfg.shift.rotation
    if not rc.enabled:
        rep.skip("shift/rotation", "evaluation.shift.rotation.enabled=false", warn=False)
        return
    if kept.ndim != 4:
        rep.skip("shift/rotation", f"inputs are not images [B, C, H, W] (shape {tuple(kept.shape)})", warn=False)
        return
    rows = []
    for angle in tqdm(rc.angles, desc="rotation", disable=not cfg.progress):
        batches, total = ctx.batches(ctx.data.test_loader, rc.max_batches)
        probs, y, _ = ctx.probs((rotated_batches(batches, angle), total), f"rot {_num(angle)}", inner=True)
        for pname, p in probs.items():
            m = M.classification_metrics(p, y, cfg.n_bins)
            rep.add_metrics(_prefixed("shift", f"rot_{_num(angle)}", pname, m))
            rows.append({"predictor": pname, "angle": float(angle), **m})
    df = pd.DataFrame(rows)
    rep.add_table("shift_rotation", df)
    rep.add_figure("shift_rotation", plots.metric_curves(df, "angle", CURVE_METRICS, "rotation (degrees)",
                                                         "rotated test set"))


def _cifar10c(ctx: _Context):
    cfg, rep = ctx.cfg, ctx.rep
    c, dataset = cfg.shift.cifar10c, ctx.data.dataset
    if not c.enabled:
        rep.skip("shift/cifar10c", "evaluation.shift.cifar10c.enabled=false", warn=False)
        return
    if _norm_name(dataset) != "cifar10":
        rep.skip("shift/cifar10c", f"in-distribution dataset is {dataset!r}, not cifar10", warn=False)
        return
    root = c.data_dir or ctx.data.data_dir
    present, reason = cifar10c_status(root, c.corruptions)
    if not present:
        rep.skip("shift/cifar10c", reason)
        return
    if reason:
        rep.skip("shift/cifar10c (some corruptions)", reason)
    rows = []
    for corruption in tqdm(present, desc="cifar10c", disable=not cfg.progress):
        for sev in c.severities:
            loader = DataLoader(load_cifar10c(root, corruption, sev, c.max_items), batch_size=cfg.chunk_size)
            probs, y, _ = ctx.probs((iter(loader), len(loader)), f"{corruption} s{sev}", inner=True)
            for pname, p in probs.items():
                rows.append({"predictor": pname, "corruption": corruption, "severity": sev,
                             **M.classification_metrics(p, y, cfg.n_bins)})
    df = pd.DataFrame(rows)
    rep.add_table("shift_cifar10c", df)
    mean = df.drop(columns="corruption").groupby(["predictor", "severity"], sort=False).mean().reset_index()
    for r in mean.to_dict("records"):
        values = {k: v for k, v in r.items() if k not in ("predictor", "severity")}
        rep.add_metrics(_prefixed("shift", f"c10c_s{r['severity']}", r["predictor"], values))
    rep.add_figure("shift_cifar10c", plots.metric_curves(df, "severity", CURVE_METRICS, "corruption severity",
                                                         "CIFAR-10-C (mean and 95% CI over corruptions)"))


# ============================================================================== adversarial
def _adversarial(ctx: _Context, kept):
    cfg, rep, attack_model = ctx.cfg, ctx.rep, ctx.attack_model
    a = cfg.adversarial
    if not a.enabled:
        rep.skip("adversarial", "evaluation.adversarial.enabled=false", warn=False)
        return
    if attack_model is not None:
        target, output = attack_model, a.attack_model_output
    elif "map" in ctx.predictors:
        target, output = ctx.predictors["map"], "probs"
    else:
        target = output = None

    def sweep(section, attacked, out, preds):
        batches, total = ctx.batches(ctx.data.test_loader, a.max_batches)
        probs, y = fgsm_sweep(attacked, out, preds, batches, a.epsilons, ctx.input_range, ctx.device,
                              bar=ProgressBar(desc=section, show=cfg.progress, total=total))
        rows = []
        for eps, by_pred in probs.items():
            for pname, p in by_pred.items():
                m = M.classification_metrics(p, y, cfg.n_bins)
                rep.add_metrics(_prefixed(section, f"eps_{_num(eps)}", pname, m))
                rows.append({"predictor": pname, "eps": eps, **m})
        return rows

    if target is None:
        rep.skip("fgsm_map", "no attack_model given and no 'map' predictor")
    else:
        df = pd.DataFrame(sweep("fgsm_map", target, output, ctx.predictors))
        rep.add_table("fgsm_map", df)
        rep.add_figure("fgsm_map", plots.metric_curves(df, "eps", ADV_METRICS, "epsilon",
                                                       "FGSM against the MAP network"))
    if a.attack_laplace:
        rows = []
        for pname, f in ctx.predictors.items():
            try:
                rows += sweep("fgsm_self", f, "probs", {pname: f})
            except NotDifferentiableError as err:
                rep.skip(f"fgsm_self/{pname}", str(err))
        if rows:
            df = pd.DataFrame(rows)
            rep.add_table("fgsm_self", df)
            rep.add_figure("fgsm_self", plots.metric_curves(df, "eps", ADV_METRICS, "epsilon",
                                                            "FGSM against each predictor"))
    else:
        rep.skip("fgsm_self", "evaluation.adversarial.attack_laplace=false", warn=False)
    _confmax(ctx, target, output, kept)


def _confmax(ctx: _Context, target, output, kept):
    cfg, rep = ctx.cfg, ctx.rep
    a, cm = cfg.adversarial, cfg.adversarial.confmax
    if not cm.enabled:
        rep.skip("confmax", "evaluation.adversarial.confmax.enabled=false", warn=False)
        return
    if ctx.input_range is None:
        rep.skip("confmax", "inputs are unbounded (input_range is None): no range to draw noise from")
        return
    x0 = uniform_noise(cm.n_samples, tuple(kept.shape[1:]), ctx.input_range, ctx.rng)

    def attack(model, out, eps):
        chunks = []
        for i in range(0, len(x0), cfg.chunk_size):
            xc = x0[i : i + cfg.chunk_size].to(ctx.device)
            chunks.append(confidence_max_attack(model, xc, eps, cm.steps, cm.step_size, ctx.input_range,
                                                out).cpu())
        return torch.cat(chunks)

    rows = []
    attacks = [("map", target, output, ctx.predictors)] if target is not None else []
    if a.attack_laplace:
        attacks += [(f"self:{n}", f, "probs", {n: f}) for n, f in ctx.predictors.items()]
    if not attacks:
        rep.skip("confmax", "nothing to attack: no attack_model, no 'map' predictor, attack_laplace=false")
        return
    for eps in tqdm(cm.epsilons, desc="confmax", disable=not cfg.progress):
        for label, model, out, preds in attacks:
            section = "confmax_map" if label == "map" else "confmax_self"
            try:
                x = attack(model, out, eps)
            except NotDifferentiableError as err:
                rep.skip(f"confmax/{label}/eps_{_num(eps)}", str(err))
                continue
            for pname, p in ctx.probs_of(x, f"{section} eps {_num(eps)}", preds).items():
                m = {"conf": M.mean_confidence(p), "entropy": M.mean_entropy(p)}
                rep.add_metrics(_prefixed(section, f"eps_{_num(eps)}", pname, m))
                rows.append({"predictor": pname, "attack": section, "eps": eps, **m})
    if rows:
        df = pd.DataFrame(rows)
        rep.add_table("confmax", df)
        rep.add_figure("confmax", plots.metric_curves(df, "eps", ("conf", "entropy"), "epsilon",
                                                      "confidence-maximising attack from noise",
                                                      style="attack"))


# ==================================================================================== toy 2-D
def _toy2d(ctx: _Context, n_classes):
    cfg, rep, data = ctx.cfg, ctx.rep, ctx.data.toy_data
    t = cfg.toy2d
    if not t.enabled:
        rep.skip("toy2d", "evaluation.toy2d.enabled=false", warn=False)
        return
    if data is None:
        rep.skip("toy2d", "no toy_data given (only 2-D toy data modules provide it)", warn=False)
        return
    X, y = data
    if X.ndim != 2 or X.shape[1] != 2:
        rep.skip("toy2d", f"inputs are not 2-D points [N, 2] (shape {tuple(X.shape)})")
        return
    if t.class_index is not None and t.class_index >= n_classes:
        raise ValueError(f"evaluation.toy2d.class_index={t.class_index} but there are {n_classes} classes")
    grid = ContourGrid(resolution=t.resolution, zoom_out=t.zoom_out, margin=t.margin, class_index=t.class_index)
    figs, far = toy2d_contours(ctx.predictors, X, y, grid, chunk_size=max(cfg.chunk_size, 1024), device=ctx.device,
                               return_border=True)
    for name, fig in figs.items():
        rep.add_figure(name, fig)
    for pname, v in far.items():
        rep.add_metrics({metric_key("toy2d", "far", pname, "conf"): float(v.mean())})
    if MAP in far and LAPLACE in far:
        rep.add_metrics({noise_key("toy2d", "far", "conf"): mean_noise(torch.from_numpy(far[MAP]),
                                                                        torch.from_numpy(far[LAPLACE]))})


# ================================================================================ landscape
def _landscape(ctx: _Context):
    cfg, rep, inputs, dataset = ctx.cfg, ctx.rep, ctx.landscape, ctx.data.dataset
    if not cfg.landscape.enabled:
        rep.skip("landscape", "evaluation.landscape.enabled=false", warn=False)
        return
    if inputs is None:
        rep.skip("landscape", "no fitted Laplace and training rows given (the evaluation plan's landscape)")
        return
    from laplace_lab.evaluation import landscape, landscape_html, landscape_plots

    ls = landscape.compute_landscape(inputs.la, inputs.train_set, inputs.test_set, cfg.landscape, cfg.chunk_size,
                                     landscape.progress_enabled(cfg.progress))
    values = landscape.metric_keys(ls)
    rep.add_metrics(values)
    for name, df in landscape.tables(ls).items():
        rep.add_table(name, df)
    rep.add_figure("landscape_1d", landscape_plots.figure_1d(ls, dataset))
    rep.add_figure("landscape_2d", landscape_plots.figure_2d(ls, dataset))
    rep.add_figure("landscape_posterior", landscape_plots.figure_posterior(ls, dataset))
    if cfg.landscape.html:
        landscape_html.write(ls, rep.out_dir / "figures" / "landscape.html", dataset)


# =============================================================================== regression
def _regression(ctx: _Context):
    cfg, rep, units = ctx.cfg, ctx.rep, ctx.data.targets
    target_mean, target_std, y_standardised = units.mean, units.std, units.standardised
    batches, total = ctx.batches(ctx.data.test_loader)
    outs, y, _ = run_predictors(ctx.predictors, batches, "regression", ctx.device, desc="test",
                                progress=cfg.progress, total=total)
    rows = []
    nominal = sorted(set(cfg.regression.coverage_levels) | {round(0.05 * k, 2) for k in range(1, 20)})
    units = {"target_mean": target_mean, "target_std": target_std, "levels": cfg.regression.coverage_levels,
             "y_standardised": y_standardised}
    if MAP in outs and LAPLACE in outs:  # evaluation.noise
        rep.add_metrics({noise_key("test", k): v for k, v in regression_noise(outs[MAP], outs[LAPLACE], y,
                                                                              **units).items()})
    for pname, (mean, var) in outs.items():
        m = M.regression_metrics(mean, var, y, **units)
        rep.add_metrics(_prefixed("test", None, pname, m))
        mo, vo, yo = M.to_original_units(mean, var, y, target_mean, target_std, y_standardised)
        rows += [{"predictor": pname, "nominal": q, "observed": M.coverage(mo, vo, yo, q)} for q in nominal]
    df = pd.DataFrame(rows)
    rep.add_table("regression_coverage", df)
    rep.add_figure("regression_coverage", plots.coverage_plot(df, "central-interval coverage (test)"))
