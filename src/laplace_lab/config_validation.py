"""Checks of a composed config that must fail before any data is loaded or any training runs.

Each check raises ``ValueError`` with the option's name and the allowed values.
"""

from __future__ import annotations

import inspect

from omegaconf import DictConfig, OmegaConf

from laplace_lab.config_values import validate_values
from laplace_lab.data.size_checks import check_data_sizes
from laplace_lab.laplace.options import Likelihood, LinkApprox, PredType
from laplace_lab.laplace.predictive import HET_APPROXES, check_nn_link
from laplace_lab.laplace.spec import LaplaceSpec, hessian_structures, structure_class
from laplace_lab.training.module import check_loss_scale

# data modules whose validation rows are held out of the training set, and the option that holds
# them out (map_grid_refit gives them back by setting it to 0); the toy sets draw theirs apart
HELD_OUT_VALIDATION = {"laplace_lab.data.UCIDataModule": "val_fraction", "laplace_lab.data.VisionDataModule": "n_val"}

LIKELIHOOD_CHOICES = ("auto", *Likelihood.values())
MARGLIK_MODES = ("off", "online", "posthoc")
POSTHOC_PRIOR = ("none", "marglik", "gridsearch")
EVIDENCE_POINTS = ("weights", "linear_mode")
NONFINITE_LOSS = ("error", "skip")
PRED_TYPES = PredType.values()
LINKS = LinkApprox.values()


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def validate_config(cfg: DictConfig) -> None:
    """Reject invalid option values and combinations of the root config and its groups
    (first the per-value checks of ``laplace_lab.config_values``: finite, in range, typed, known keys)."""
    validate_values(cfg)
    check_data_sizes(cfg.data)  # sizes against the data set (toy2d classes, a fifth of the images to validation)
    _require(cfg.likelihood in LIKELIHOOD_CHOICES,
             f"likelihood={cfg.likelihood!r} is not supported; allowed: {list(LIKELIHOOD_CHOICES)}")
    _require(isinstance(cfg.seed, int) and cfg.seed >= 0, f"seed must be a non-negative integer; got {cfg.seed!r}")
    for name in ("sigma_noise", "temperature"):
        value = cfg.get(name)
        _require(isinstance(value, (int, float)) and value > 0, f"{name} must be a positive number; got {value!r}")
    weight_decay = cfg.optimizer.get("weight_decay", 0.0)
    _require(
        not weight_decay,
        f"optimizer.weight_decay={weight_decay} is not allowed; allowed: 0. The Gaussian prior is the "
        "weight decay: set prior_precision (delta = weight_decay * N) instead.",
    )
    _require(cfg.trainer.max_epochs is None or cfg.trainer.max_epochs >= 1,
             f"trainer.max_epochs must be >= 1; got {cfg.trainer.max_epochs}")
    _choice(cfg, "on_nonfinite_loss", NONFINITE_LOSS)
    if cfg.get("het_head", "softplus") != "softplus":
        from laplace_lab.models.het_head import HET_HEADS

        _choice(cfg, "het_head", HET_HEADS)
        _require(cfg.likelihood == "heteroscedastic_regression",
                 f"het_head={cfg.het_head!r} is a head of likelihood=heteroscedastic_regression; got likelihood={cfg.likelihood!r}")
    check_loss_scale(cfg.map_loss_scale, cfg.likelihood)
    threads = cfg.get("torch_num_threads")
    _require(threads is None or (isinstance(threads, int) and threads >= 1),
             f"torch_num_threads must be null or a positive integer; got {threads!r}")
    flush = cfg.get("flush_denormal")
    _require(isinstance(flush, bool), f"flush_denormal must be true or false; got {flush!r}")
    grid = cfg.get("map_grid")
    _require(
        grid is None or (len(grid) > 0 and all(isinstance(v, (int, float)) and v > 0 for v in grid)),
        f"map_grid must be null or a non-empty list of positive prior precisions; got {grid}",
    )
    _require(not (grid and cfg.marglik.mode == "online"),
             "map_grid needs marglik.mode in ['off', 'posthoc'] (online marglik learns the prior precision)")
    refit = cfg.get("map_grid_refit", False)
    _require(isinstance(refit, bool), f"map_grid_refit must be true or false; got {refit!r}")
    _require(not refit or grid, "map_grid_refit=true needs a map_grid (a list of prior precisions); got map_grid=null")
    target = cfg.data.get("_target_")
    _require(not refit or target in HELD_OUT_VALIDATION,
             f"map_grid_refit=true needs data whose validation rows are held out of the training set "
             f"(allowed: {sorted(HELD_OUT_VALIDATION)}); data {target!r} draws its validation set apart")
    in_loss = cfg.get("prior_in_map_loss", True)
    _require(isinstance(in_loss, bool), f"prior_in_map_loss must be true or false; got {in_loss!r}")
    _require(in_loss or (cfg.marglik.mode != "online" and not grid),
             "prior_in_map_loss=false needs marglik.mode in ['off', 'posthoc'] and map_grid=null (online marglik "
             "and the weight-decay grid act through the prior term of the loss)")
    validate_laplace_config(cfg)


def _choice(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> str:
    value = OmegaConf.select(cfg, key)
    _require(value in allowed, f"{key}={value!r} is not supported; allowed: {list(allowed)}")
    return value


def _stray_options(curvature: DictConfig, declared: tuple[str, ...]) -> list[str]:
    """Options of other structures that ``curvature`` sets to something other than null or their
    structure's default (e.g. ``kfac_approx=reduce`` with ``hessian_structure=diag``), which the
    chosen structure would silently ignore."""
    stray = set()
    for name in hessian_structures():
        cls = structure_class(name)
        params = inspect.signature(cls.__init__).parameters
        for key in cls.options:
            value = curvature.get(key)
            default = params[key].default if key in params else None
            if key not in declared and value is not None and value != default:
                stray.add(key)
    return sorted(stray)


def validate_laplace_config(cfg: DictConfig) -> None:
    """The curvature x prior x marglik x predictive combination."""
    structure = OmegaConf.select(cfg, "curvature.hessian_structure")
    declared = structure_class(structure).options if structure in hessian_structures() else ()
    if structure in hessian_structures():  # (an unknown name gets the spec's error below)
        stray = _stray_options(cfg.curvature, declared)
        _require(not stray, f"curvature.{', curvature.'.join(stray)} is an option of another hessian_structure, "
                 f"not of curvature.hessian_structure={structure!r} (its options: {list(declared)}); remove it "
                 "or set it to null")
    spec = LaplaceSpec(  # the engine's names and compatibility rules (laplace.spec)
        subset_of_weights=OmegaConf.select(cfg, "curvature.subset_of_weights"),
        hessian_structure=OmegaConf.select(cfg, "curvature.hessian_structure"),
        curvature=OmegaConf.select(cfg, "curvature.type"), prior_structure=OmegaConf.select(cfg, "prior.structure"),
        options={k: cfg.curvature[k] for k in declared if cfg.curvature.get(k) is not None},
        keys={"subset_of_weights": "curvature.subset_of_weights", "hessian_structure": "curvature.hessian_structure",
              "curvature": "curvature.type", "prior_structure": "prior.structure"}
        | {k: f"curvature.{k}" for k in declared}).validate()
    structure, curvature_type = spec.hessian_structure, spec.curvature
    mode = _choice(cfg, "marglik.mode", MARGLIK_MODES)
    pred_type = _choice(cfg, "predictive.pred_type", PRED_TYPES)
    link = _choice(cfg, "predictive.link_approx", LINKS)
    check_nn_link(pred_type, link, key=lambda name: f"predictive.{name}")
    het_approx = _choice(cfg, "predictive.het_approx", HET_APPROXES) if "het_approx" in cfg.predictive else "mean"
    if het_approx != "mean":
        _require(cfg.likelihood in ("auto", "heteroscedastic_regression"),
                 f"predictive.het_approx={het_approx!r} needs likelihood=heteroscedastic_regression; "
                 f"got likelihood={cfg.likelihood!r}")
        _require(pred_type == "glm" and link == "probit",
                 f"predictive.het_approx={het_approx!r} is a closed form of the glm predictive: it needs "
                 f"predictive.pred_type=glm and predictive.link_approx=probit; got {pred_type!r}, {link!r}")
    delta = cfg.prior.prior_precision
    _require(isinstance(delta, (int, float)) and delta > 0, f"prior.prior_precision must be a positive number; got {delta!r}")
    _require(int(cfg.curvature.n_mc_samples) >= 1, f"curvature.n_mc_samples must be >= 1; got {cfg.curvature.n_mc_samples}")
    posthoc = cfg.marglik.get("posthoc_prior", "none")
    _require(posthoc in POSTHOC_PRIOR, f"marglik.posthoc_prior={posthoc!r} is not supported; allowed: {list(POSTHOC_PRIOR)}")
    if mode == "online":
        for key in ("frequency", "n_steps"):
            _require(int(cfg.marglik[key]) >= 1, f"marglik.{key} must be >= 1; got {cfg.marglik[key]}")
        _require(int(cfg.marglik.burnin) >= 0, f"marglik.burnin must be >= 0; got {cfg.marglik.burnin}")
        _require(cfg.marglik.log_min < cfg.marglik.log_max, "marglik.log_min must be < marglik.log_max")
        fused = cfg.marglik.get("fused", False)
        _require(
            not fused or (curvature_type in ("ef", "mc_fisher") and structure_class(structure).supports_fused
                          and cfg.curvature.subset_of_weights == "all"),
            "marglik.fused=true needs curvature.type in ['ef', 'mc_fisher'], curvature.hessian_structure in "
            f"{[n for n in hessian_structures() if structure_class(n).supports_fused]} and "
            f"curvature.subset_of_weights='all'; got type={curvature_type!r}, "
            f"structure={structure!r}, subset={cfg.curvature.subset_of_weights!r}",
        )
    validate_evidence_point(cfg, mode, posthoc, curvature_type, pred_type)
    _require(
        not (posthoc == "gridsearch" and pred_type == "map"),
        "marglik.posthoc_prior='gridsearch' needs a Laplace predictive; allowed predictive.pred_type: ['glm', 'nn']",
    )


def validate_evidence_point(cfg: DictConfig, mode: str, posthoc: str, curvature_type: str, pred_type: str) -> None:
    """``marglik.evidence_point`` (Antoran et al. 2022): ``linear_mode`` needs a post-hoc Laplace
    whose prior is fixed or tuned by the evidence, a GGN and a Gaussian or categorical likelihood."""
    point = cfg.marglik.get("evidence_point", "weights")
    _require(point in EVIDENCE_POINTS, f"marglik.evidence_point={point!r} is not supported; allowed: {list(EVIDENCE_POINTS)}")
    if point == "weights":
        return
    _require(mode in ("off", "posthoc"),
             f"marglik.evidence_point='linear_mode' needs marglik.mode in ['off', 'posthoc']; got {mode!r} "
             "(online marglik evaluates the evidence at the weights during training)")
    _require(mode == "posthoc" or pred_type != "map",
             "marglik.evidence_point='linear_mode' needs a post-hoc Laplace: marglik.mode='posthoc' or "
             "predictive.pred_type in ['glm', 'nn']")
    _require(posthoc in ("none", "marglik"),
             f"marglik.evidence_point='linear_mode' needs marglik.posthoc_prior in ['none', 'marglik']; got {posthoc!r}")
    _require(curvature_type == "ggn",
             f"marglik.evidence_point='linear_mode' needs curvature.type='ggn' (the Hessian of the linearised "
             f"model's loss); got {curvature_type!r}")
    _require(cfg.likelihood in ("auto", "classification", "regression"),
             f"marglik.evidence_point='linear_mode' needs likelihood in ['auto', 'classification', 'regression']; "
             f"got {cfg.likelihood!r}")
