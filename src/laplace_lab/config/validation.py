"""Combinations of options that must fail before any data is loaded or any training runs
(``check_combinations``, on the typed ``RunConfig``; each option's own type and range are checked by
``config.schema`` first). Each check raises ``ValueError`` naming the options and the allowed values.

``config.load.load_run_config(cfg)`` reads a composed config (``DictConfig``) into the typed config and
runs every check, these last: the one call the entry point makes before anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from laplace_lab.config.interplay import check_interplay
from laplace_lab.config.schema import RunConfig
from laplace_lab.data.registry import data_modules, required_class
from laplace_lab.evaluation.options import check_landscape_run
from laplace_lab.laplace.predictive import check_nn_link
from laplace_lab.laplace.spec import LaplaceSpec, hessian_structures, structure_class

LOSS_SCALES = ("nll", "mse")


def check_loss_scale(loss_scale: str, likelihood: str) -> None:
    """``ValueError`` naming ``map_loss_scale`` and its allowed values: one of ``LOSS_SCALES``, and
    ``mse`` only for regression (``likelihood`` ``regression``, or a config's ``auto``)."""
    if loss_scale not in LOSS_SCALES:
        raise ValueError(f"map_loss_scale={loss_scale!r} is not supported; allowed: {list(LOSS_SCALES)}")
    if loss_scale == "mse" and likelihood not in ("auto", "regression"):
        raise ValueError(f"map_loss_scale='mse' needs likelihood 'regression' (got {likelihood!r}); "
                         "allowed for this likelihood: map_loss_scale in ['nll']")


def _require(condition: bool, message: str | Callable[[], str]) -> None:
    """``ValueError(message)`` unless ``condition``; a callable message is built only then (it may list
    every data module, which imports them)."""
    if not condition:
        raise ValueError(message() if callable(message) else message)


def check_combinations(run: RunConfig) -> None:
    """Every combination check below, in the order a user meets them."""
    check_root(run)
    check_trainer(run)
    check_laplace(run)
    check_augmentation(run)
    check_landscape_run(run.evaluation, run.curvature.hessian_structure, run.needs_posthoc_laplace)
    check_ensemble(run)
    check_checkpoint(run)
    check_interplay(run)  # options that bound each other; runs that would train nothing


def check_root(run: RunConfig) -> None:
    """The root options with each other and with the MAP training."""
    weight_decay = run.optimizer.get("weight_decay", 0.0)
    _require(
        not weight_decay,
        f"optimizer.weight_decay={weight_decay} is not allowed; allowed: 0. The Gaussian prior is the "
        "weight decay: set prior_precision (delta = weight_decay * N) instead.",
    )
    check_loss_scale(run.map_loss_scale, run.likelihood)
    _require(run.het_head == "softplus" or run.likelihood == "heteroscedastic_regression",
             f"het_head={run.het_head!r} is a head of likelihood=heteroscedastic_regression; "
             f"got likelihood={run.likelihood!r}")
    grid = run.map_grid
    _require(
        grid is None or (len(grid) > 0 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                               for v in grid)),
        f"map_grid must be null or a non-empty list of positive prior precisions; got {grid}",
    )
    _require(not (grid and run.marglik.online),
             "map_grid needs marglik.mode in ['off', 'posthoc'] (online marglik learns the prior precision)")
    refit = run.map_grid_refit
    _require(not refit or grid, "map_grid_refit=true needs a map_grid (a list of prior precisions); got map_grid=null")
    _require(not refit or required_class(run.data).validation_option is not None,
             lambda: "map_grid_refit=true needs data whose validation rows are held out of the training set "
             f"(allowed: {list(data_modules(lambda cls: cls.validation_option is not None))}); "
             f"data {run.data.get('_target_')!r} draws its validation set apart")
    _require(run.prior_in_map_loss or (not run.marglik.online and not grid),
             "prior_in_map_loss=false needs marglik.mode in ['off', 'posthoc'] and map_grid=null (online marglik "
             "and the weight-decay grid act through the prior term of the loss)")


def check_trainer(run: RunConfig) -> None:
    """``trainer.strategy`` with the process counts and the features a DDP run supports: several
    devices or nodes need ``strategy=ddp``; DDP trains one network (no map_grid, no ensemble) with
    the non-fused online marglik and no augmentation (``training.online_marglik``)."""
    t = run.trainer
    devices = len(t.devices) if isinstance(t.devices, (list, tuple)) else t.devices
    many = (isinstance(devices, int) and devices > 1) or t.num_nodes > 1
    _require(not many or t.strategy == "ddp",
             f"trainer.devices={t.devices!r} with trainer.num_nodes={t.num_nodes} runs several processes: it needs "
             f"trainer.strategy=ddp (trainer=ddp); got trainer.strategy={t.strategy!r}. Allowed with "
             "strategy=auto: trainer.devices=1 and trainer.num_nodes=1")
    if t.strategy != "ddp":
        return
    unsupported = [name for name, on in (
        ("map_grid", bool(run.map_grid)), ("ensemble.enabled=true", run.ensemble.enabled),
        ("marglik.fused=true", run.marglik.online and run.marglik.fused),
        (f"augmentation.mode={run.augmentation.mode!r}", run.augmentation.wraps_model)) if on]
    _require(not unsupported,
             f"trainer.strategy=ddp (trainer=ddp) trains one network with the non-fused online marglik; not "
             f"supported with it: {', '.join(unsupported)}. Allowed: map_grid=null, ensemble.enabled=false, "
             "marglik.fused=false, augmentation=none, or trainer.strategy=auto")


def _stray_options(curvature: dict, declared: tuple[str, ...]) -> list[str]:
    """Options of other structures that ``curvature`` sets to something other than null or their
    structure's default (e.g. ``kfac_approx=reduce`` with ``hessian_structure=diag``), which the
    chosen structure would silently ignore."""
    stray = set()
    for name in hessian_structures():
        defaults = structure_class(name).option_defaults()
        for key, default in defaults.items():
            value = curvature.get(key)
            if key not in declared and value is not None and value != default:
                stray.add(key)
    return sorted(stray)


def check_laplace(run: RunConfig) -> None:
    """The curvature x prior x marglik x predictive combination."""
    c, marglik = run.curvature, run.marglik
    structure = c.hessian_structure
    declared = structure_class(structure).options if structure in hessian_structures() else ()
    if structure in hessian_structures():  # (an unknown name gets the spec's error below)
        stray = _stray_options(c.structure_options, declared)
        _require(not stray, f"curvature.{', curvature.'.join(stray)} is an option of another hessian_structure, "
                 f"not of curvature.hessian_structure={structure!r} (its options: {list(declared)}); remove it "
                 "or set it to null")
    LaplaceSpec(  # the engine's names and compatibility rules (laplace.spec)
        subset_of_weights=c.subset_of_weights, hessian_structure=structure, curvature=c.type,
        prior_structure=run.prior.structure,
        options={k: c.structure_options[k] for k in declared if c.structure_options.get(k) is not None},
        keys={"subset_of_weights": "curvature.subset_of_weights", "hessian_structure": "curvature.hessian_structure",
              "curvature": "curvature.type", "prior_structure": "prior.structure"}
        | {k: f"curvature.{k}" for k in declared}).validate()
    check_nn_link(run.predictive.pred_type, run.predictive.link_approx, key=lambda name: f"predictive.{name}")
    check_het_approx(run)
    if marglik.online:
        _require(marglik.log_min < marglik.log_max, f"marglik.log_min={marglik.log_min} must be < marglik.log_max="
                 f"{marglik.log_max} (the clamp range of the log hyperparameters)")
        _require(
            not marglik.fused or (c.type in ("ef", "mc_fisher") and structure_class(structure).supports_fused
                                  and c.subset_of_weights == "all"),
            "marglik.fused=true needs curvature.type in ['ef', 'mc_fisher'], curvature.hessian_structure in "
            f"{[n for n in hessian_structures() if structure_class(n).supports_fused]} and "
            f"curvature.subset_of_weights='all'; got type={c.type!r}, "
            f"structure={structure!r}, subset={c.subset_of_weights!r}",
        )
    check_evidence_point(run)
    _require(
        not (marglik.posthoc_prior == "gridsearch" and run.predictive.pred_type == "map"),
        "marglik.posthoc_prior='gridsearch' needs a Laplace predictive; allowed predictive.pred_type: ['glm', 'nn']",
    )


def check_het_approx(run: RunConfig) -> None:
    """``predictive.het_approx`` other than ``mean``: a closed form of the heteroscedastic glm predictive."""
    p = run.predictive
    if p.het_approx == "mean":
        return
    _require(run.likelihood in ("auto", "heteroscedastic_regression"),
             f"predictive.het_approx={p.het_approx!r} needs likelihood=heteroscedastic_regression; "
             f"got likelihood={run.likelihood!r}")
    _require(p.pred_type == "glm" and p.link_approx == "probit",
             f"predictive.het_approx={p.het_approx!r} is a closed form of the glm predictive: it needs "
             f"predictive.pred_type=glm and predictive.link_approx=probit; got {p.pred_type!r}, {p.link_approx!r}")


def check_evidence_point(run: RunConfig) -> None:
    """``marglik.evidence_point`` (Antoran et al. 2022): ``linear_mode`` needs a post-hoc Laplace
    whose prior is fixed or tuned by the evidence, a GGN and a Gaussian or categorical likelihood."""
    marglik = run.marglik
    if marglik.evidence_point == "weights":
        return
    _require(not marglik.online,
             f"marglik.evidence_point='linear_mode' needs marglik.mode in ['off', 'posthoc']; got {marglik.mode!r} "
             "(online marglik evaluates the evidence at the weights during training)")
    _require(run.needs_posthoc_laplace,
             "marglik.evidence_point='linear_mode' needs a post-hoc Laplace: marglik.mode='posthoc' or "
             "predictive.pred_type in ['glm', 'nn']")
    _require(marglik.posthoc_prior in ("none", "marglik"),
             f"marglik.evidence_point='linear_mode' needs marglik.posthoc_prior in ['none', 'marglik']; got "
             f"{marglik.posthoc_prior!r}")
    _require(run.curvature.type == "ggn",
             f"marglik.evidence_point='linear_mode' needs curvature.type='ggn' (the Hessian of the linearised "
             f"model's loss); got {run.curvature.type!r}")
    _require(run.likelihood in ("auto", "classification", "regression"),
             f"marglik.evidence_point='linear_mode' needs likelihood in ['auto', 'classification', 'regression']; "
             f"got {run.likelihood!r}")


def check_augmentation(run: RunConfig) -> None:
    """``augmentation/`` with the data, the predictive and the online marglik (modes fixed, learned)."""
    from laplace_lab.laplace import differentiable_marglik as dm
    from laplace_lab.models.augmentation import TRANSFORMS, AffineAugmentation

    aug = run.augmentation
    if not aug.wraps_model:
        return
    mode = aug.mode
    AffineAugmentation(int(aug.n_samples), dict(aug.init), list(aug.learnable) if mode == "learned" else [],
                       aug.interpolation)  # raises on bad names / values
    _require(required_class(run.data).images,
             f"augmentation.mode={mode!r} needs an image data set (data=mnist, ...); got "
             f"data._target_={run.data.get('_target_')!r}")
    _require(run.predictive.pred_type != "glm",
             f"augmentation.mode={mode!r} supports predictive.pred_type in ['map', 'nn'] (the GLM predictive of an "
             "output-averaged network is not implemented); got predictive.pred_type='glm'")
    c = run.curvature
    if run.marglik.online:  # the prior step fits the averaged model's curvature (fit_for_marglik)
        structures = dm.laplace_structures()
        _require(c.subset_of_weights == "all" and c.hessian_structure in structures and c.type in dm.CURVATURE_TYPES,
                 f"augmentation.mode={mode!r} with marglik=online needs curvature.subset_of_weights=all, "
                 f"curvature.hessian_structure in {list(structures)} and curvature.type in "
                 f"{list(dm.CURVATURE_TYPES)}; got ({c.subset_of_weights}, {c.hessian_structure}, {c.type})")
        _require(not run.marglik.fused,
                 f"augmentation.mode={mode!r} needs marglik.fused=false (the fused curvature is the engine's KFAC of "
                 "the augmented rows, not the averaged model's); got marglik.fused=true")
    if mode == "learned":
        _require(bool(aug.learnable), "augmentation.mode=learned needs a non-empty augmentation.learnable; "
                 f"allowed names: {list(TRANSFORMS)}")
        _require(run.marglik.online, f"augmentation.mode=learned needs marglik=online (the ranges are learned by the "
                 f"online marglik); got marglik.mode={run.marglik.mode!r}")
        _require(run.prior.structure in ("scalar", "layerwise"),
                 f"augmentation.mode=learned needs prior.structure in ['scalar', 'layerwise']; got {run.prior.structure!r}")


def check_ensemble(run: RunConfig) -> None:
    """``ensemble.*`` with the MAP cache, the marglik, the grid and resuming."""
    ens = run.ensemble
    if ens.member is not None:
        _require(ens.enabled, "ensemble.member needs ensemble.enabled=true (e.g. method=deep_ensemble or method=mola)")
        _require(isinstance(ens.member, int) and not isinstance(ens.member, bool) and 0 <= ens.member < ens.size,
                 f"ensemble.member must be null or an integer in [0, ensemble.size={ens.size}); got {ens.member!r}")
        _require(run.map_cache.enabled and not run.marglik.online,
                 "ensemble.member=<k> only trains member k into the MAP cache: it needs map_cache.enabled=true "
                 f"and marglik.mode in ['off', 'posthoc']; got map_cache.enabled={run.map_cache.enabled}, "
                 f"marglik.mode={run.marglik.mode!r}")
    if not ens.enabled:
        return
    _require(not run.map_grid,
             "map_grid is not supported with ensemble.enabled=true; allowed: map_grid=null (set prior.prior_precision)")
    _require(ens.member is not None or not run.checkpoint.resume_from,
             "checkpoint.resume_from resumes one network; with ensemble.enabled=true it is only allowed for a "
             "single-member job (ensemble.member=<k>)")


def check_checkpoint(run: RunConfig) -> None:
    """``resume_from=last`` needs ``checkpoint.enabled=true`` (nothing would write the file it
    resumes); a ``map_grid`` run trains one network per grid point, so one checkpoint path
    cannot resume it (``last`` resumes each grid point from its own); a path must name an existing file."""
    resume = run.checkpoint.resume_from
    if resume == "last" and not run.checkpoint.enabled:
        raise ValueError("checkpoint.resume_from=last resumes the run's own last.ckpt, which only "
                         "checkpoint.enabled=true writes; set checkpoint.enabled=true, or resume_from to null or a .ckpt path")
    if resume and resume != "last" and run.map_grid:
        raise ValueError(f"checkpoint.resume_from={str(resume)!r} with map_grid: each grid point trains its own "
                         "network, so one checkpoint cannot resume them; allowed: checkpoint.resume_from=last "
                         "(each grid point from its own last.ckpt) or null")
    if resume and resume != "last" and not Path(str(resume)).is_file():
        raise ValueError(f"checkpoint.resume_from={str(resume)!r} does not exist (or is not a file); allowed: the "
                         "path of a .ckpt file, last (the run's own last.ckpt, if any) or null")
