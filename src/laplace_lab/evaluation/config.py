"""Typed, validated view of the ``evaluation`` config group (``conf/evaluation/*.yaml``).

``validate_config(cfg)`` takes a mapping (an OmegaConf node or a ``dict``; missing keys take the
defaults below) and returns a frozen :class:`EvalConfig`. Every bad value raises ``ValueError``
naming the option (``evaluation.<path>``) and the allowed values, and unknown keys are rejected
with the list of known ones, so a typo fails when the config is composed, before any training.
Written by hand: Hydra structured configs would do the type checks but not the range checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laplace_lab.evaluation.adversarial import ATTACK_OUTPUTS


class _Check:
    """Validators: each returns the normalised value or raises ValueError naming the option."""

    @staticmethod
    def boolean(v, name):
        if not isinstance(v, bool):
            raise ValueError(f"{name}={v!r} must be a boolean; allowed: [true, false]")
        return v

    @staticmethod
    def int_at_least(lo, optional=False):
        def check(v, name):
            if v is None and optional:
                return None
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                extra = " or null" if optional else ""
                raise ValueError(f"{name}={v!r} must be an integer >= {lo}{extra}")
            return v
        return check

    @staticmethod
    def positive_float(optional=False):
        def check(v, name):
            if v is None and optional:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                extra = " or null" if optional else ""
                raise ValueError(f"{name}={v!r} must be a positive number{extra}")
            return float(v)
        return check

    @staticmethod
    def float_list(lo=None, hi=None, open_lo=False, open_hi=False, nonempty=True):
        def check(v, name):
            if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
                raise ValueError(f"{name}={v!r} must be a list of numbers")
            out = []
            for e in v:
                if isinstance(e, bool) or not isinstance(e, (int, float)):
                    raise ValueError(f"{name} entries must be numbers; got {e!r}")
                bad_lo = lo is not None and (e <= lo if open_lo else e < lo)
                bad_hi = hi is not None and (e >= hi if open_hi else e > hi)
                if bad_lo or bad_hi:
                    lb = "(" if open_lo else "["
                    rb = ")" if open_hi else "]"
                    raise ValueError(f"{name} entries must lie in {lb}{lo}, {hi}{rb}; got {e!r}")
                out.append(float(e))
            if nonempty and not out:
                raise ValueError(f"{name} must not be empty")
            return tuple(out)
        return check

    @staticmethod
    def int_list(lo, hi):
        def check(v, name):
            if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v:
                raise ValueError(f"{name}={v!r} must be a non-empty list of integers in [{lo}, {hi}]")
            for e in v:
                if isinstance(e, bool) or not isinstance(e, int) or not lo <= e <= hi:
                    raise ValueError(f"{name} entries must be integers in [{lo}, {hi}]; got {e!r}")
            return tuple(v)
        return check

    @staticmethod
    def str_list_or_none(v, name):
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
            raise ValueError(f"{name}={v!r} must be a list of names or null")
        if not all(isinstance(e, str) for e in v):
            raise ValueError(f"{name} entries must be strings; got {list(v)!r}")
        return tuple(v)

    @staticmethod
    def str_or_none(v, name):
        if v is not None and not isinstance(v, str):
            raise ValueError(f"{name}={v!r} must be a string (a path) or null")
        return v

    @staticmethod
    def choice(options):
        def check(v, name):
            if v not in options:
                raise ValueError(f"{name}={v!r} is not supported; allowed: {list(options)}")
            return v
        return check

    @staticmethod
    def input_range(v, name):
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or len(v) != 2:
            raise ValueError(f"{name}={v!r} must be [low, high] or null (unbounded inputs)")
        lo, hi = (float(e) for e in v)
        if not lo < hi:
            raise ValueError(f"{name}={list(v)!r} needs low < high")
        return (lo, hi)

    @staticmethod
    def int_or_none(v, name):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{name}={v!r} must be a class index (integer >= 0) or null (max-confidence)")
        return v


def _f(default, check):
    """A dataclass field with a default and a validator."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"check": check})
    return field(default=default, metadata={"check": check})


def _sub(cls):
    return field(default_factory=cls, metadata={"sub": cls})


C = _Check


@dataclass(frozen=True)
class OODConfig:
    enabled: bool = _f(True, C.boolean)
    datasets: tuple[str, ...] | None = _f(None, C.str_list_or_none)  # None: every loader given
    noise: bool = _f(True, C.boolean)  # uniform noise in input_range
    far_away: bool = _f(True, C.boolean)  # far_away_alpha * x_test (Kristiadi et al. 2020)
    far_away_alpha: float = _f(100.0, C.positive_float())
    n_generated: int = _f(2000, C.int_at_least(1))  # size of the noise / far-away sets
    max_batches: int | None = _f(None, C.int_at_least(1, optional=True))


@dataclass(frozen=True)
class RotationConfig:
    enabled: bool = _f(True, C.boolean)
    angles: tuple[float, ...] = _f(tuple(float(a) for a in range(0, 181, 15)), C.float_list(-360.0, 360.0))
    max_batches: int | None = _f(None, C.int_at_least(1, optional=True))


@dataclass(frozen=True)
class Cifar10CConfig:
    enabled: bool = _f(True, C.boolean)  # only runs when the in-distribution set is CIFAR-10
    data_dir: str | None = _f(None, C.str_or_none)  # None: the runner's data_dir / $LAPLACE_LAB_DATA_DIR / data
    corruptions: tuple[str, ...] | None = _f(None, C.str_list_or_none)  # None: all present
    severities: tuple[int, ...] = _f((1, 2, 3, 4, 5), C.int_list(1, 5))
    max_items: int | None = _f(None, C.int_at_least(1, optional=True))  # per corruption and severity


@dataclass(frozen=True)
class ShiftConfig:
    rotation: RotationConfig = _sub(RotationConfig)
    cifar10c: Cifar10CConfig = _sub(Cifar10CConfig)


@dataclass(frozen=True)
class ConfMaxConfig:
    enabled: bool = _f(True, C.boolean)
    epsilons: tuple[float, ...] = _f((0.0, 0.05, 0.1, 0.2), C.float_list(0.0))
    steps: int = _f(10, C.int_at_least(1))
    step_size: float | None = _f(None, C.positive_float(optional=True))  # None: 2.5 * eps / steps
    n_samples: int = _f(500, C.int_at_least(1))


@dataclass(frozen=True)
class AdversarialConfig:
    enabled: bool = _f(False, C.boolean)
    epsilons: tuple[float, ...] = _f((0.0, 0.01, 0.02, 0.05, 0.1, 0.2), C.float_list(0.0))
    attack_laplace: bool = _f(False, C.boolean)  # also attack every predictor itself (fgsm_self)
    attack_model_output: str = _f("auto", C.choice(ATTACK_OUTPUTS))
    max_batches: int | None = _f(10, C.int_at_least(1, optional=True))
    confmax: ConfMaxConfig = _sub(ConfMaxConfig)


@dataclass(frozen=True)
class RegressionConfig:
    coverage_levels: tuple[float, ...] = _f((0.5, 0.9, 0.95), C.float_list(0.0, 1.0, open_lo=True, open_hi=True))


@dataclass(frozen=True)
class Toy2DConfig:
    enabled: bool = _f(True, C.boolean)  # drawn only when the caller passes toy_data
    zoom_out: float = _f(10.0, C.positive_float())  # the zoomed-out view spans zoom_out x the data range
    resolution: int = _f(150, C.int_at_least(10))  # grid points per axis
    margin: float = _f(0.5, C.positive_float())  # zoomed-in view: data range +- margin * range
    class_index: int | None = _f(None, C.int_or_none)  # None: max-confidence; k: p(class k)


LANDSCAPE_DIRECTIONS = ("random", "eigen")
LANDSCAPE_BIASES = ("zero", "weights")


@dataclass(frozen=True)
class LandscapeConfig:
    """Loss-landscape slices around the MAP beside the Laplace Gaussian (``evaluation.landscape``)."""

    enabled: bool = _f(False, C.boolean)
    directions: str = _f("random", C.choice(LANDSCAPE_DIRECTIONS))  # random: filter-normalised; eigen: top of H
    n_directions: int = _f(2, C.int_at_least(2))  # 1-D slices along each; the 2-D slice spans the first two
    grid_points: int = _f(21, C.int_at_least(3))  # per axis of the 2-D grids
    grid_points_1d: int = _f(51, C.int_at_least(3))  # of the 1-D grids
    extent: float = _f(1.0, C.positive_float())  # loss / test-metric grid: [-extent, extent] x the direction
    posterior_extent: float | None = _f(None, C.positive_float(optional=True))  # likelihood grid; null: n_std
    posterior_n_std: float = _f(3.0, C.positive_float())  # likelihood grid: +- this many Gaussian slice stds
    n_train: int | None = _f(2000, C.int_at_least(1, optional=True))  # training rows for the loss; null: all
    n_test: int | None = _f(2000, C.int_at_least(1, optional=True))  # test rows for the metric; null: all
    biases: str = _f("zero", C.choice(LANDSCAPE_BIASES))  # random directions of 1-D tensors
    seed: int = _f(0, C.int_at_least(0))  # random directions and row subsets
    html: bool = _f(True, C.boolean)  # also figures/landscape.html (self-contained, no server)


@dataclass(frozen=True)
class EvalConfig:
    enabled: bool = _f(True, C.boolean)
    n_bins: int = _f(15, C.int_at_least(2))  # calibration bins (papers use 10, 15 or 100)
    input_range: tuple[float, float] | None = _f((0.0, 1.0), C.input_range)
    max_test_batches: int | None = _f(None, C.int_at_least(1, optional=True))
    chunk_size: int = _f(256, C.int_at_least(1))  # batch size for generated inputs and grids
    progress: bool = _f(True, C.boolean)
    seed: int = _f(0, C.int_at_least(0))
    reliability_diagram: bool = _f(True, C.boolean)
    ood: OODConfig = _sub(OODConfig)
    shift: ShiftConfig = _sub(ShiftConfig)
    adversarial: AdversarialConfig = _sub(AdversarialConfig)
    regression: RegressionConfig = _sub(RegressionConfig)
    toy2d: Toy2DConfig = _sub(Toy2DConfig)
    landscape: LandscapeConfig = _sub(LandscapeConfig)


def _to_container(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg


def _build(cls, data: Mapping | None, path: str):
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ValueError(f"{path} must be a mapping; got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown option(s) {[f'{path}.{k}' for k in unknown]}; allowed: {sorted(fields)}")
    values = {}
    for name, f in fields.items():
        if name not in data:
            continue
        if "sub" in f.metadata:
            values[name] = _build(f.metadata["sub"], data[name], f"{path}.{name}")
        else:
            values[name] = f.metadata["check"](data[name], f"{path}.{name}")
    return cls(**values)


def validate_config(cfg: Any = None, prefix: str = "evaluation") -> EvalConfig:
    """``cfg`` (an OmegaConf node, a dict, None or an ``EvalConfig``) -> validated ``EvalConfig``.

    A top-level ``name`` key (the yaml's own label) is accepted and ignored.
    """
    if isinstance(cfg, EvalConfig):
        return cfg
    data = _to_container(cfg)
    if isinstance(data, Mapping):
        data = {k: v for k, v in data.items() if k != "name"}
    cfg = _build(EvalConfig, data, prefix)
    if cfg.landscape.enabled and not cfg.enabled:
        raise ValueError(f"{prefix}.landscape.enabled=true needs {prefix}.enabled=true (the landscape is drawn "
                         "by the evaluation)")
    return cfg


def check_landscape_run(cfg: EvalConfig, hessian_structure: str, fits_laplace: bool,
                        prefix: str = "evaluation") -> None:
    """The landscape's needs from the rest of a run, checked before training: a fitted Laplace
    (``fits_laplace``) and, for ``directions=eigen``, a ``curvature.hessian_structure`` that offers
    eigenvectors of its curvature."""
    from laplace_lab.laplace.spec import hessian_structures, structure_class
    from laplace_lab.laplace.structures.base import offers_eigenvectors

    land = cfg.landscape
    if not land.enabled:
        return
    if not fits_laplace:
        raise ValueError(f"{prefix}.landscape.enabled=true needs a post-hoc Laplace (its Gaussian is drawn beside "
                         "the loss): marglik.mode='posthoc' or predictive.pred_type in ['glm', 'nn']")
    if land.directions == "eigen" and hessian_structure in hessian_structures() \
            and not offers_eigenvectors(structure_class(hessian_structure)):
        offering = [n for n in hessian_structures() if offers_eigenvectors(structure_class(n))]
        raise ValueError(f"{prefix}.landscape.directions='eigen' needs a curvature.hessian_structure with "
                         f"eigenvectors; allowed: {offering}; got {hessian_structure!r} (or use "
                         f"{prefix}.landscape.directions='random')")


def config_to_dict(cfg: EvalConfig) -> dict:
    """Plain nested dict (tuples as lists), e.g. for JSON."""

    def conv(v):
        if isinstance(v, tuple):
            return [conv(e) for e in v]
        if isinstance(v, dict):
            return {k: conv(e) for k, e in v.items()}
        return v

    return conv(dataclasses.asdict(cfg))
