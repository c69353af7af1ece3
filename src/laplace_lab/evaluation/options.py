"""The ``evaluation`` group's options: each option's type, default and allowed values declared once
(``io.fields.option``), as for the groups of ``config.schema`` (which lists ``EvalConfig`` in ``GROUPS``).

``config.store`` registers the defaults as the ``schema/evaluation`` node that ``conf/evaluation/*.yaml``
list first (each file keeps only what differs), and ``config.load`` reads the composed node into a
frozen :class:`EvalConfig` (``fields.build``: an unknown key, a wrong type or a value out of range
raises ``ValueError`` naming ``evaluation.<option>`` and the allowed values). The evaluation itself
(``evaluation.run_evaluation``) reads the options from the ``EvalConfig`` in its plan. Values are kept
as the config writes them (lists as lists, ``angles: [0, 15]`` as integers).

Adding an option: one ``option(...)`` field below (and a yaml value only where an option file or a
preset differs from the default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from laplace_lab.evaluation.adversarial import ATTACK_OUTPUTS
from laplace_lab.io.fields import build, group, option

POSITIVE = {"low": 0, "low_open": True}  # a number > 0
LANDSCAPE_DIRECTIONS = ("random", "eigen")
LANDSCAPE_BIASES = ("zero", "weights")
INPUT_RANGE_MESSAGE = "{name}={value!r} is not supported; allowed: [low, high] with low < high, or null (unbounded inputs)"


def is_input_range(value: Any) -> bool:
    """``[low, high]`` (a list or tuple of two numbers) with ``low < high``."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return False
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return False
    return value[0] < value[1]


@dataclass(frozen=True)
class OODConfig:
    """``evaluation.ood``: the test set against OOD sets (given loaders and generated inputs)."""

    enabled: bool = option(True, "bool")
    datasets: list | None = option(None, "list", items="str", nullable=True)  # None: every loader given
    noise: bool = option(True, "bool")  # uniform noise in input_range
    far_away: bool = option(True, "bool")  # far_away_alpha * x_test (Kristiadi et al. 2020)
    far_away_alpha: float = option(100.0, "float", **POSITIVE)
    n_generated: int = option(2000, "int", low=1)  # size of the noise / far-away sets
    max_batches: int | None = option(None, "int", low=1, nullable=True)  # per OOD loader; null: max_test_batches


@dataclass(frozen=True)
class RotationConfig:
    """``evaluation.shift.rotation``: the rotated test set (image inputs only)."""

    enabled: bool = option(True, "bool")
    angles: list = option(list(range(0, 181, 15)), "list", items="float", low=-360, high=360, nonempty=True)
    max_batches: int | None = option(None, "int", low=1, nullable=True)  # null: max_test_batches


@dataclass(frozen=True)
class Cifar10CConfig:
    """``evaluation.shift.cifar10c``: only runs when the in-distribution set is CIFAR-10 and the files
    are in ``<data_dir>/CIFAR-10-C/``."""

    enabled: bool = option(True, "bool")
    data_dir: str | None = option(None, "str", nullable=True)  # None: the runner's data_dir / $LAPLACE_LAB_DATA_DIR / data
    corruptions: list | None = option(None, "list", items="str", nullable=True)  # None: all present
    severities: list = option([1, 2, 3, 4, 5], "list", items="int", low=1, high=5, nonempty=True)
    max_items: int | None = option(None, "int", low=1, nullable=True)  # per corruption and severity; null: all


@dataclass(frozen=True)
class ShiftConfig:
    rotation: RotationConfig = group(RotationConfig)
    cifar10c: Cifar10CConfig = group(Cifar10CConfig)


@dataclass(frozen=True)
class ConfMaxConfig:
    """``evaluation.adversarial.confmax``: the confidence-maximising attack from uniform noise."""

    enabled: bool = option(True, "bool")
    epsilons: list = option([0.0, 0.05, 0.1, 0.2], "list", items="float", low=0, nonempty=True)
    steps: int = option(10, "int", low=1)
    step_size: float | None = option(None, "float", nullable=True, **POSITIVE)  # None: 2.5 * eps / steps
    n_samples: int = option(500, "int", low=1)


@dataclass(frozen=True)
class AdversarialConfig:
    """``evaluation.adversarial``: the FGSM epsilon sweep (and ``confmax``)."""

    enabled: bool = option(False, "bool")
    epsilons: list = option([0.0, 0.01, 0.02, 0.05, 0.1, 0.2], "list", items="float", low=0, nonempty=True)
    attack_laplace: bool = option(False, "bool")  # also attack every predictor itself (fgsm_self, confmax_self)
    attack_model_output: str = option("auto", "str", choices=ATTACK_OUTPUTS)  # auto: nn.Module -> logits
    max_batches: int | None = option(10, "int", low=1, nullable=True)  # test batches attacked; null: max_test_batches
    confmax: ConfMaxConfig = group(ConfMaxConfig)


@dataclass(frozen=True)
class RegressionConfig:
    coverage_levels: list = option([0.5, 0.9, 0.95], "list", items="float", low=0, low_open=True, high=1,
                                   high_open=True, nonempty=True)  # central-interval coverage


@dataclass(frozen=True)
class Toy2DConfig:
    """``evaluation.toy2d``: contours, drawn only when the data module gives 2-D toy data."""

    enabled: bool = option(True, "bool")
    zoom_out: float = option(10.0, "float", **POSITIVE)  # the zoomed-out view spans zoom_out x the data range
    resolution: int = option(150, "int", low=10)  # grid points per axis
    margin: float = option(0.5, "float", **POSITIVE)  # zoomed-in view: data range +- margin * range
    class_index: int | None = option(None, "int", low=0, nullable=True,
                                     describe=" (a class index; null: max-confidence)")  # k: p(class k)


@dataclass(frozen=True)
class LandscapeConfig:
    """``evaluation.landscape``: loss-landscape slices around the MAP beside the Laplace Gaussian
    (``evaluation.landscape``); needs a post-hoc Laplace; cost: grid points x forward passes over the rows."""

    enabled: bool = option(False, "bool")
    # random: filter-normalised (Li et al. 2018) | eigen: top eigenvectors of the curvature
    directions: str = option("random", "str", choices=LANDSCAPE_DIRECTIONS)
    n_directions: int = option(2, "int", low=2)  # 1-D slices along each; the 2-D slice spans the first two
    grid_points: int = option(21, "int", low=3)  # per axis of the 2-D grids
    grid_points_1d: int = option(51, "int", low=3)  # of the 1-D grids
    extent: float = option(1.0, "float", **POSITIVE)  # loss / test-metric grid: [-extent, extent] x the direction
    # likelihood-vs-Gaussian grids, in direction units; null: posterior_n_std
    posterior_extent: float | None = option(None, "float", nullable=True, **POSITIVE)
    posterior_n_std: float = option(3.0, "float", **POSITIVE)  # ... +- this many Gaussian slice stds
    n_train: int | None = option(2000, "int", low=1, nullable=True)  # training rows for the loss; null: all
    n_test: int | None = option(2000, "int", low=1, nullable=True)  # test rows for the metric; null: all
    # random directions of 1-D tensors (biases, norm scales): zero | weights (d = theta)
    biases: str = option("zero", "str", choices=LANDSCAPE_BIASES)
    seed: int = option(0, "int", low=0)  # random directions and row subsets
    html: bool = option(True, "bool")  # also figures/landscape.html (self-contained, no server)


@dataclass(frozen=True)
class EvalConfig:
    """``evaluation/``: what ``evaluation.run_evaluation`` computes. Classification: test metrics and the
    reliability diagram, OOD (given sets + uniform noise + far-away), the rotated test set (images),
    CIFAR-10-C, attacks (off by default), toy contours, the landscape (off by default); regression:
    test log likelihood and RMSE in original units, central-interval coverage."""

    name: str = option("default", "str")  # the option file's label
    enabled: bool = option(True, "bool")
    n_bins: int = option(15, "int", low=2)  # calibration bins for ECE/MCE/reliability (papers: 10, 15 or 100)
    # valid inputs (noise OOD, FGSM clamp); null: unbounded
    input_range: list | None = option([0.0, 1.0], "any", nullable=True, accepts=is_input_range,
                                      message=INPUT_RANGE_MESSAGE)
    max_test_batches: int | None = option(None, "int", low=1, nullable=True)  # null: the whole test set
    chunk_size: int = option(256, "int", low=1)  # batch size for generated inputs and contour grids
    progress: bool = option(True, "bool")  # tqdm progress bars
    seed: int = option(0, "int", low=0)  # for generated noise
    reliability_diagram: bool = option(True, "bool")
    ood: OODConfig = group(OODConfig)
    shift: ShiftConfig = group(ShiftConfig)
    adversarial: AdversarialConfig = group(AdversarialConfig)
    regression: RegressionConfig = group(RegressionConfig)
    toy2d: Toy2DConfig = group(Toy2DConfig)
    landscape: LandscapeConfig = group(LandscapeConfig)


def evaluation_config(data: Any = None) -> EvalConfig:
    """An ``EvalConfig`` from ``data`` (an OmegaConf node, a dict or None; missing keys take the
    defaults), for callers outside a composed run (tests, peer scripts)."""
    # imported here: the engine benchmarks import the schema without omegaconf installed
    from omegaconf import OmegaConf

    if OmegaConf.is_config(data):
        data = OmegaConf.to_container(data, resolve=True)
    return build(EvalConfig, data, "evaluation")


def check_landscape_run(cfg: EvalConfig, hessian_structure: str, fits_laplace: bool) -> None:
    """The landscape's needs from the rest of a run, checked before training: the evaluation on, a
    fitted Laplace (``fits_laplace``) and, for ``directions=eigen``, a ``curvature.hessian_structure``
    that offers eigenvectors of its curvature."""
    from laplace_lab.laplace.spec import hessian_structures, structure_class
    from laplace_lab.laplace.structures.base import offers_eigenvectors

    land = cfg.landscape
    if not land.enabled:
        return
    if not cfg.enabled:
        raise ValueError("evaluation.landscape.enabled=true needs evaluation.enabled=true (the landscape is drawn "
                         "by the evaluation)")
    if not fits_laplace:
        raise ValueError("evaluation.landscape.enabled=true needs a post-hoc Laplace (its Gaussian is drawn beside "
                         "the loss): marglik.mode='posthoc' or predictive.pred_type in ['glm', 'nn']")
    if land.directions == "eigen" and hessian_structure in hessian_structures() \
            and not offers_eigenvectors(structure_class(hessian_structure)):
        offering = [n for n in hessian_structures() if offers_eigenvectors(structure_class(n))]
        raise ValueError(f"evaluation.landscape.directions='eigen' needs a curvature.hessian_structure with "
                         f"eigenvectors; allowed: {offering}; got {hessian_structure!r} (or use "
                         f"evaluation.landscape.directions='random')")
