"""The typed schema of the run config: one frozen dataclass per config group, each option's type,
default and allowed values declared once (``fields.option``).

A ``REQUIRED`` option has no default: every option file of the group sets it (``marglik.mode``,
``curvature.hessian_structure``, ...). The defaults are what the group's option files start from (``config.store`` registers them as
``schema/<group>`` nodes that ``conf/<group>/*.yaml`` list first), so a yaml file keeps only what
differs. ``Spec.options`` names the option files whose node carries a key (``marglik/online`` has
``frequency``, ``marglik/off`` has not); the dataclass has every key, so code reads the default of a
key its option does not carry. The ``_target_`` groups (``data``, ``model``, ``optimizer``,
``lr_scheduler``) are typed by their constructors' signatures instead (``config.values``); the
``evaluation`` group's dataclasses are in ``evaluation.options``.

Adding an option to a group: one ``option(...)`` field here (and a yaml value only where a preset or
an option file differs from the default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from laplace_lab.evaluation.options import EvalConfig
from laplace_lab.io.fields import REQUIRED, group, option
from laplace_lab.laplace.options import Likelihood, LinkApprox, PredType
from laplace_lab.laplace.plan import AUTO_FIT_BATCH_CAP
from laplace_lab.laplace.predictive import HET_APPROXES
from laplace_lab.models.augmentation import TRANSFORMS
from laplace_lab.models.het_head import HET_HEADS

ONLINE, POSTHOC, OFF = ("online",), ("posthoc",), ("off",)


@dataclass(frozen=True)
class PathsConfig:
    """``paths/``: where data are read and runs are written (run-only: never part of a result)."""

    data_dir: str = option("${oc.env:LAPLACE_LAB_DATA_DIR,data}", "str")  # env LAPLACE_LAB_DATA_DIR, else data/
    output_root: str = option("outputs", "str")  # Hydra run folders: config, CSV, wandb, figures


# The loggers and the trainer name their classes by ``_target_`` (the node is that class's constructor
# arguments, as in lightning-hydra-template; ``config.targets.SLOTS`` allows exactly these classes).
# Our own switches (``enabled``, ``trainer.loop``) are not arguments; the run adds its own
# (``save_dir``, the callbacks, ...). The plain loop runs the same options through its Lightning-free
# stand-ins (``training.loops``: ``CSVMetricsLogger``, ``PlainTrainer``).
CSV_LOGGER = "pytorch_lightning.loggers.CSVLogger"
WANDB_LOGGER = "pytorch_lightning.loggers.WandbLogger"
TRAINER = "pytorch_lightning.Trainer"
NOT_ARGUMENTS = ("_target_", "enabled", "loop")  # keys of the logger and trainer nodes


def constructor_arguments(node: Any) -> dict[str, Any]:
    """The constructor arguments of a typed ``_target_`` node (a logger's, the trainer's): its
    options but ``NOT_ARGUMENTS``, and the trainer's ``extra`` (further Lightning arguments)."""
    out = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)
           if "spec" in f.metadata and f.name not in NOT_ARGUMENTS}
    return {**out, **getattr(node, "extra", {})}


@dataclass(frozen=True)
class CsvLoggerConfig:
    """``logger.csv``: the run's ``csv/metrics.csv`` (its folder and file name are the run's: the
    reports read them there)."""

    _target_: str = option(CSV_LOGGER, "str")
    enabled: bool = option(True, "bool")


@dataclass(frozen=True)
class WandbConfig:
    """``logger.wandb``: a wandb run in ``<run dir>/wandb`` (``reporting.run_loggers``)."""

    _target_: str = option(WANDB_LOGGER, "str")
    enabled: bool = option(True, "bool")
    # offline | online | disabled: checked when the logger is built (the default follows the environment's
    # WANDB_MODE, which Lightning's offline logger sets to "dryrun" in its process)
    mode: str = option("${oc.env:WANDB_MODE,offline}", "str")
    project: str = option("laplace-lab", "str")
    entity: str | None = option(None, "str", nullable=True)
    group: str = option("${experiment_name}", "str")
    job_type: str = option("train", "str")
    tags: list = option([], "list")


@dataclass(frozen=True)
class LoggerConfig:
    """``logger/``: CSV always; wandb offline unless ``WANDB_MODE=online`` or ``logger.wandb.mode=online``."""

    csv: CsvLoggerConfig = group(CsvLoggerConfig)
    wandb: WandbConfig = group(WandbConfig)


FIT_BATCH_AUTO = "auto"
FIT_BATCH_MESSAGE = ("{name}={value!r} is not supported; allowed: null (data.eval_batch_size), an integer >= 1, "
                     "or 'auto' (on CUDA the largest data.eval_batch_size x 2^k, at most "
                     f"{AUTO_FIT_BATCH_CAP} and the training set, whose planned fit fits the memory budget "
                     "unstreamed; on the CPU data.eval_batch_size)")


def _fit_batch_ok(value: Any) -> bool:
    """``curvature.fit_batch_size``: null, a positive integer or ``auto``."""
    return value is None or value == FIT_BATCH_AUTO or (isinstance(value, int) and not isinstance(value, bool)
                                                        and value >= 1)


@dataclass(frozen=True)
class CurvatureConfig:
    """``curvature/``: which weights (``subset_of_weights``: all | last_layer), which structure
    (``hessian_structure``: a registered structure, e.g. full | diag | kron | lowrank) and which matrix
    (``type``: ggn | ef | mc_fisher). Choices and their combinations are the engine's
    (``laplace.spec.LaplaceSpec``); a structure's own options (kron's ``kfac_approx``, lowrank's
    ``n_eigs``) are declared by its class and read into ``structure_options``."""

    subset_of_weights: str = option(REQUIRED, "str")
    hessian_structure: str = option(REQUIRED, "str")
    type: str = option("ggn", "str")
    n_mc_samples: int = option(1, "int", low=1)  # sampled labels per datum for type=mc_fisher
    # null: data.eval_batch_size; auto: chosen from the memory budget (training.laplace_plan.fit_batch_size)
    fit_batch_size: int | str | None = option(None, "any", accepts=_fit_batch_ok, message=FIT_BATCH_MESSAGE)
    structure_options: dict = field(default_factory=dict)  # not a key: the structure's options that are set

    def laplace_kwargs(self) -> dict[str, Any]:
        """Engine arguments (``Laplace(..., **kwargs)``); the structure's options as ``structure_options``."""
        kwargs = {"subset_of_weights": self.subset_of_weights, "hessian_structure": self.hessian_structure,
                  "curvature": self.type, "n_mc_samples": int(self.n_mc_samples)}
        if self.structure_options:
            kwargs["structure_options"] = dict(self.structure_options)
        return kwargs


@dataclass(frozen=True)
class PriorConfig:
    """``prior/``: the Gaussian prior N(0, 1/delta): ``structure`` scalar (one delta) | layerwise (one per
    parameter tensor, weights and biases apart) | diagonal (one per parameter) | normgroups (one per
    group of weights a normalisation layer makes scale invariant, plus one for the rest; Antoran et al.
    2022); ``prior_precision`` is the initial delta (and the MAP loss's weight decay, delta / N)."""

    structure: str = option(REQUIRED, "str")
    prior_precision: float = option(1.0, "float", low=0, low_open=True, describe=" (the prior precision delta)")


@dataclass(frozen=True)
class LinearModeConfig:
    """``marglik.linear_mode``: the solver of ``evidence_point=linear_mode``
    (``laplace.linear_mode.fit_linear_mode``): at most ``n_outer`` alternations until the log precisions
    move < ``tol``; Newton-CG on the linearised loss (``round_newton`` steps per alternation, null: to
    convergence; the final solve: ``max_newton`` steps to a relative decrement ``newton_tol``; CG to
    ``cg_tol`` in <= ``cg_max_iter`` products, KFAC-preconditioned for kron fits), on a seeded random
    subset of ``solve_subset`` training rows (NLL scaled by N / solve_subset; null: all rows).

    The defaults are a CPU budget, an inexact alternation that usually stops before ``tol``
    (``laplace/linear_mode_converged = 0``): LeNet-5 on MNIST, one thread, it cost 4.3 epochs of MAP
    training on 5k images (~0.4 epochs on the 55k set), besides one pass over all rows for the final
    data term. A tighter solve: ``n_outer=20 tol=1e-3 round_newton=null max_newton=20 newton_tol=1e-8
    cg_tol=1e-6 cg_max_iter=100 solve_subset=null`` (each CG product is then a pass over all rows: on
    the full MNIST set a CPU run was still in round 1 after 16 minutes)."""

    n_outer: int = option(5, "int", low=1)
    tol: float = option(5.0e-2, "float", low=0, low_open=True)
    round_newton: int | None = option(1, "int", low=1, nullable=True)
    prior_max_iter: int = option(100, "int", low=1)
    max_newton: int = option(3, "int", low=1)
    newton_tol: float = option(1.0e-4, "float", low=0, low_open=True)
    cg_tol: float = option(1.0e-2, "float", low=0, low_open=True)
    cg_max_iter: int = option(3, "int", low=1)
    solve_subset: int | None = option(1000, "int", low=1, nullable=True)


@dataclass(frozen=True)
class MarglikConfig:
    """``marglik/``: how the marginal likelihood tunes the hyperparameters.

    ``mode``: ``off`` (the prior stays at ``prior.prior_precision``), ``online`` (Immer et al. 2021,
    Alg. 1: every ``frequency`` (F) epochs after ``burnin`` (B) epochs, fit a Laplace and take
    ``n_steps`` (K) Adam steps on the log prior precisions, and the log noise std for regression) or
    ``posthoc`` (train with the fixed prior, then tune the post-hoc Laplace's prior by its evidence).
    """

    mode: str = option(REQUIRED, "str", choices=("off", "online", "posthoc"))
    # Where the evidence is evaluated (Antoran et al. 2022): weights (the trained weights) | linear_mode
    # (the mode of the model linearised at the trained weights, alternated with the prior precision; the
    # glm predictive mean becomes the linear model's there). linear_mode needs curvature.type=ggn.
    evidence_point: str = option("weights", "str", choices=("weights", "linear_mode"), options=OFF + POSTHOC)
    # Prior tuning of the post-hoc Laplace after training: none | marglik | gridsearch.
    posthoc_prior: str = option("none", "str", choices=("none", "marglik", "gridsearch"), options=ONLINE + POSTHOC)
    frequency: int = option(1, "int", low=1, options=ONLINE)
    n_steps: int = option(100, "int", low=1, options=ONLINE + POSTHOC)
    burnin: int = option(0, "int", low=0, options=ONLINE)
    lr_hyp: float = option(0.1, "float", low=0, low_open=True, options=ONLINE + POSTHOC)
    # Cosine decay of lr_hyp to lr_hyp_min over all hyper steps of the run (null: constant).
    lr_hyp_min: float | None = option(None, "float", low=0, nullable=True, options=ONLINE)
    optimize_sigma: bool = option(True, "bool", options=ONLINE)
    # Restore the weights and hyperparameters with the best marglik at the end of training.
    early_stopping: bool = option(True, "bool", options=ONLINE)
    # Clamp range of every log hyperparameter.
    log_min: float = option(-12.0, "float", options=ONLINE)
    log_max: float = option(12.0, "float", options=ONLINE)
    # Accumulate the curvature (type ef | mc_fisher, structure kron | diag, all weights) during the
    # training steps of the epoch before each marglik step instead of an extra data pass.
    fused: bool = option(False, "bool", options=ONLINE)
    linear_mode: LinearModeConfig = group(LinearModeConfig, options=POSTHOC)

    @property
    def online(self) -> bool:
        """Hyperparameters learned during training (the online-marglik callback runs)."""
        return self.mode == "online"

    @property
    def posthoc(self) -> bool:
        """A post-hoc Laplace is fitted after training to tune the prior."""
        return self.mode == "posthoc"


@dataclass(frozen=True)
class PredictiveConfig:
    """``predictive/``: the Laplace predictive evaluated beside the MAP plug-in: ``pred_type`` map |
    glm | nn; ``link_approx`` probit | mc | bridge (classification); ``n_samples`` for mc / nn;
    ``het_approx`` mean | natural: the heteroscedastic glm closed form (``laplace.predictive``)."""

    pred_type: str = option(REQUIRED, "str", choices=PredType.values())
    link_approx: str = option(REQUIRED, "str", choices=LinkApprox.values())
    n_samples: int = option(100, "int", low=1)
    het_approx: str = option("mean", "str", choices=HET_APPROXES)


NONE, FIXED, LEARNED = ("none",), ("fixed",), ("learned",)


@dataclass(frozen=True)
class AugmentationConfig:
    """``augmentation/`` (images): the network's logits averaged over ``n_samples`` affine
    transformations ``T(x; eta * eps)``, ``eps ~ U(-1, 1)``; ``mode`` none | fixed (``init`` ranges)
    | learned (the ``learnable`` ranges optimised on the Laplace marglik, one Adam step per marglik
    epoch at a rate cosine-decayed from ``lr`` to ``lr_min``; needs ``marglik=online``; Immer, van der
    Ouderaa et al. 2022, defaults of the authors' classification_image.py)."""

    mode: str = option("none", "str", choices=("none", "fixed", "learned"))
    # With marglik=online and mode none: still report augmentation/<name> = 0 and
    # marglik/best_log_marglik in metrics.json, as the fixed / learned rows do.
    report: bool = option(False, "bool", options=NONE)
    n_samples: int = option(31, "int", options=FIXED + LEARNED)
    # eta per transform: translate_x, translate_y (normalised units: 1 = half the image), rotation
    # (radians, pi = full circle), scale_x, scale_y (log scale), shear.
    init: dict = option({}, "dict", options=FIXED + LEARNED)
    learnable: list = option(list(TRANSFORMS), "list", options=LEARNED)
    interpolation: str = option("bilinear", "str", options=FIXED + LEARNED)  # bilinear (the authors') | bicubic
    lr: float = option(0.05, "float", options=LEARNED, message="{name} must be > 0; got {value!r}", low=0,
                       low_open=True)
    lr_min: float = option(0.05, "float", options=LEARNED, message="{name} must be > 0; got {value!r}", low=0,
                           low_open=True)

    @property
    def wraps_model(self) -> bool:
        """The network is wrapped in ``AugmentedModel`` (mode fixed or learned)."""
        return self.mode != "none"


@dataclass(frozen=True)
class MapCacheConfig:
    """``map_cache``: reuse a trained MAP network across runs whose training config, data files and code
    are identical (never with online marglik); an unwritable ``dir`` only warns."""

    enabled: bool = option(False, "bool")
    dir: str = option("${paths.output_root}/map_cache", "str")


POSITIVE_INT = "{name} must be a positive integer; got {value!r}"


@dataclass(frozen=True)
class EnsembleConfig:
    """``ensemble``: deep ensembles / MoLA (``method=deep_ensemble``, ``method=mola``): ``size`` members,
    member k trained like a single run with seed ``seed + k * seed_stride`` (member 0 = this run's
    network); ``member: k`` only trains member k into the MAP cache (one launcher job per member)."""

    enabled: bool = option(False, "bool")
    size: int = option(5, "int", low=1, message=POSITIVE_INT)
    seed_stride: int = option(1000, "int", low=1, message=POSITIVE_INT)
    member: int | None = option(None, "any")


@dataclass(frozen=True)
class CheckpointConfig:
    """``checkpoint``: Lightning checkpoints (they carry the online-marglik state). Kept: ``last.ckpt``
    (rewritten every ``every_n_epochs``) and, if ``monitor`` names a logged metric (e.g. val/nll), the
    best one by it (``best-epoch<N>.ckpt``, ``mode`` min | max). ``resume_from``: null, a ``.ckpt`` path
    (a new run from it: same seed, data and model), or ``last`` (the run's own last.ckpt if any: the
    same run continued, same config and code; see ``training.resume``)."""

    enabled: bool = option(False, "bool")
    dirpath: str | None = option(None, "str", nullable=True)  # null: <run dir>/checkpoints
    every_n_epochs: int = option(1, "int", low=1)
    monitor: str | None = option(None, "str", nullable=True)
    mode: str = option("min", "str", choices=("min", "max"))
    resume_from: str | None = option(None, "str", nullable=True)


DEVICES_MESSAGE = ("{name}={value!r} is not supported; allowed: an integer >= 1 (that many devices), -1 (every "
                   "visible device), 'auto', or a non-empty list of distinct device ids >= 0")


def _devices_ok(value: Any) -> bool:
    """``trainer.devices``: what Lightning's ``Trainer(devices=...)`` takes, less its comma strings."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(value, (list, tuple)):
        return bool(value) and all(is_int(v) and v >= 0 for v in value) and len(set(value)) == len(value)
    return value == "auto" or (is_int(value) and (value >= 1 or value == -1))


@dataclass(frozen=True)
class TrainerConfig:
    """``trainer/``: the class of the trainer (``_target_``: Lightning's ``Trainer``) and its keyword
    arguments (loggers and callbacks are added by the run), except ``loop``: auto | lightning | plain
    (``training.loop_choice``). Other Trainer arguments (``+trainer.<name>=...``) are checked against
    its signature and kept in ``extra``."""

    _target_: str = option(TRAINER, "str")
    loop: str = option("auto", "str", choices=("auto", "lightning", "plain"))
    max_epochs: int | None = option(20, "int", low=1, nullable=True)
    accelerator: str = option("auto", "str")
    devices: Any = option(1, "any", accepts=_devices_ok, message=DEVICES_MESSAGE)
    # auto (one process) | ddp (Lightning DDP: one process per device, `devices` x `num_nodes` in all;
    # conf/trainer/ddp.yaml, docs/gpu.md)
    strategy: str = option("auto", "str", choices=("auto", "ddp"))
    num_nodes: int = option(1, "int", low=1)  # nodes of a DDP run (SLURM: one task per device on each)
    deterministic: Any = option(False, "any")
    log_every_n_steps: int = option(10, "int", low=1)
    enable_progress_bar: bool = option(True, "bool")
    enable_model_summary: bool = option(False, "bool")
    gradient_clip_val: float | None = option(None, "float", low=0, low_open=True, nullable=True)
    limit_train_batches: float = option(1.0, "float", low=0)
    limit_val_batches: float = option(1.0, "float", low=0)
    extra: dict = field(default_factory=dict)  # not a key: further Trainer arguments that are set

    def lightning_kwargs(self) -> dict[str, Any]:
        """Lightning's ``Trainer`` arguments: every option but ``_target_`` and ``loop``."""
        return constructor_arguments(self)


TRAINER_KEYS = tuple(f.name for f in dataclasses.fields(TrainerConfig) if "spec" in f.metadata)  # its options


@dataclass(frozen=True)
class RootOptions:
    """The root keys of ``conf/train.yaml`` (outside any group)."""

    experiment_name: str = option("default", "str")  # output folders and the wandb group
    method_name: str = option("custom", "str")  # set by method/ presets: the row of a results table
    seed: int = option(0, "int", low=0)
    # torch intra-op threads (null: torch's default). Use 1 for jobs that share cores with other jobs:
    # small linear algebra slows down by 10-20x when several multi-threaded jobs oversubscribe a CPU.
    torch_num_threads: int | None = option(None, "int", low=1, nullable=True)
    # Treat subnormal floats as zero on the CPU (torch.set_flush_denormal). Training and curvature fits
    # that produce them (e.g. an MLP on FashionMNIST after a few epochs) run 5-8x slower without it.
    flush_denormal: bool = option(True, "bool")
    # classification | regression | heteroscedastic_regression | auto (from the data module's task)
    likelihood: str = option("auto", "str", choices=("auto", *Likelihood.values()))
    # heteroscedastic_regression: the noise-precision link, softplus (eta2 = -softplus(raw)) | half_softplus
    # (eta2 = -0.5 (softplus(raw) + 1e-8), the heteroscedastic-nn authors' NaturalHead; models.het_head)
    het_head: str = option("softplus", "str", choices=HET_HEADS)
    sigma_noise: float = option(1.0, "float", low=0, low_open=True)  # initial regression noise std
    temperature: float = option(1.0, "float", low=0, low_open=True)  # loss = NLL / T + prior / N
    # false: train the MAP network on the NLL alone (no prior term in the loss); prior.prior_precision
    # then only starts a post-hoc Laplace.
    prior_in_map_loss: bool = option(True, "bool")
    # Scale of the MAP training loss: nll (NLL / (B T) + prior / N) | mse (regression only: that times
    # 2 sigma^2 T, laplace-torch marglik_training's objective; same minimiser, other Adam steps once
    # online marglik moves sigma).
    map_loss_scale: str = option("nll", "str", choices=("nll", "mse"))
    # A non-finite training loss: error (stop the run, naming epoch and batch) | skip (skip the batch;
    # counted in train/skipped_batches). Final metrics that are not finite always fail the run.
    on_nonfinite_loss: str = option("error", "str", choices=("error", "skip"))
    # Grid search of the MAP prior precision by validation NLL: a list of values, each trained from the
    # same seed (training.map_grid); null = train once with prior.prior_precision.
    map_grid: list | None = option(None, "list", nullable=True)
    # After the grid search: false = the chosen grid network is the MAP (regression sigma: its validation
    # RMSE); true = train it once more on all training rows, the validation rows included (regression
    # sigma: the training RMSE), as the heteroscedastic-nn authors' MAP-CV does. Needs map_grid.
    map_grid_refit: bool = option(False, "bool")
    map_cache: MapCacheConfig = group(MapCacheConfig)
    ensemble: EnsembleConfig = group(EnsembleConfig)
    checkpoint: CheckpointConfig = group(CheckpointConfig)
    # The training module's class (training.build; Lightning's twin under the Lightning loop).
    module: dict = option({"_target_": "laplace_lab.training.module.MAPCore"}, "dict")


# Groups with a dataclass here, and the option files that get their own node (None: one node for all).
GROUPS: dict[str, tuple[type, tuple[str, ...] | None]] = {
    "paths": (PathsConfig, None),
    "logger": (LoggerConfig, None),
    "curvature": (CurvatureConfig, None),
    "prior": (PriorConfig, None),
    "marglik": (MarglikConfig, ("off", "online", "posthoc")),
    "predictive": (PredictiveConfig, None),
    "augmentation": (AugmentationConfig, ("none", "fixed", "learned")),
    "trainer": (TrainerConfig, None),
    "evaluation": (EvalConfig, None),
}


@dataclass(frozen=True)
class RunConfig(RootOptions):
    """One job's validated config (``config.load.load_run_config``): the root options, the typed
    groups, the ``_target_`` groups as plain nodes (``instantiate`` them), and ``raw``, the resolved
    job config it was read from (hashes, identities, ``config_resolved.yaml``)."""

    paths: PathsConfig = field(default_factory=PathsConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    curvature: CurvatureConfig = field(default_factory=CurvatureConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    marglik: MarglikConfig = field(default_factory=MarglikConfig)
    predictive: PredictiveConfig = field(default_factory=PredictiveConfig)
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    data: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    optimizer: dict = field(default_factory=dict)
    lr_scheduler: dict | None = None
    callbacks: dict = field(default_factory=dict)  # conf/callbacks/: {name: {_target_: factory}}, in order
    aggregate: dict | None = None  # the preset's table (reporting.sweep_table)
    sweep_objective: str | None = None  # the metric train.main returns to a sweeper (default val/nll)
    raw: dict = field(default_factory=dict, repr=False)
    source: dict = field(default_factory=dict, repr=False)  # raw before resolution (config.load.replaced)

    @property
    def needs_posthoc_laplace(self) -> bool:
        """A Laplace is fitted after training: to tune its prior, or for a Laplace predictive."""
        return self.marglik.posthoc or self.predictive.pred_type != "map"
