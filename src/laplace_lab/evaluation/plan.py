"""What one evaluation runs: :class:`EvaluationPlan`, the argument of ``runner.run_evaluation``.

A plan holds the evaluation options (an ``EvalConfig``, ``options``), the task, the
predictors, the rows (:class:`EvalData`), the network FGSM attacks, the landscape's inputs and where
the files go. It is checked when it is made (task, predictors, input range), before any prediction.
Light to import: no pandas or matplotlib.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from laplace_lab.evaluation.options import EvalConfig, is_input_range

TASKS = ("classification", "regression")
FROM_CONFIG = "config"  # EvalData.input_range: take evaluation.input_range


@dataclass(frozen=True)
class TargetUnits:
    """Regression targets: ``mean`` / ``std`` (float or ``[O]``) of their standardisation; ``standardised``:
    the test loader gives them standardised (as the data modules do), False: in original units."""

    mean: Any = 0.0
    std: Any = 1.0
    standardised: bool = True


@dataclass(frozen=True)
class EvalData:
    """The rows an evaluation predicts on.

    ``test_loader`` / ``ood_loaders`` (``{name: loader}``, labels unused) yield ``(x, y)`` batches;
    ``dataset``: the in-distribution set's name (``cifar10`` enables CIFAR-10-C); ``data_dir``: the data
    root for CIFAR-10-C (else ``evaluation.shift.cifar10c.data_dir``, else ``$LAPLACE_LAB_DATA_DIR``, else
    ``data``); ``input_range``: the valid inputs ``(low, high)``, None (unbounded, e.g. the data module's
    ``input_range``) or ``"config"`` (``evaluation.input_range``); ``toy_data``: ``(X [N, 2], y [N])``
    drawn on the toy contours (None: skipped); ``targets``: the regression units.
    """

    test_loader: DataLoader
    ood_loaders: dict[str, DataLoader] = field(default_factory=dict)
    dataset: str | None = None
    data_dir: str | None = None
    input_range: tuple[float, float] | None | str = FROM_CONFIG
    toy_data: tuple[Tensor, Tensor] | None = None
    targets: TargetUnits = field(default_factory=TargetUnits)

    def __post_init__(self):
        r = self.input_range
        if r is not None and r != FROM_CONFIG and not is_input_range(r):
            raise ValueError(f"input_range={r!r} is not supported; allowed: (low, high) with low < high, None "
                             f"(unbounded inputs) or {FROM_CONFIG!r} (evaluation.input_range)")


@dataclass
class LandscapeInputs:
    """What a landscape needs besides its config: a fitted ``laplace_lab.laplace.Laplace`` (its
    model at the MAP) and the training and test rows (``(x, y)`` datasets)."""

    la: Any
    train_set: Dataset
    test_set: Dataset


@dataclass(frozen=True)
class EvaluationPlan:
    """One evaluation: ``config`` (the options: ``options.evaluation_config`` reads them from a dict), ``task`` (classification | regression), ``predictors`` (``{name: predictor}``, the
    contract in the package docstring), ``data``, ``attack_model`` (what FGSM attacks: a logits
    ``nn.Module`` or a probs predictor; None: ``predictors["map"]`` if present), ``landscape`` (the
    fitted Laplace and rows for ``evaluation.landscape``; None: skipped), ``out_dir`` (figures, tables
    and metric files) and ``label`` (the run's data set and predictive, above every figure's title)."""

    config: EvalConfig
    task: str
    predictors: dict[str, Callable]
    data: EvalData
    attack_model: Callable | None = None
    landscape: LandscapeInputs | None = None
    out_dir: str | Path = "."
    label: str = ""

    def __post_init__(self):
        if not isinstance(self.config, EvalConfig):
            raise TypeError(f"EvaluationPlan.config must be an EvalConfig (evaluation.options.evaluation_config "
                            f"reads one from a dict); got {type(self.config).__name__}")
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not supported; allowed: {list(TASKS)}")
        if not self.predictors:
            raise ValueError("an evaluation needs at least one predictor")

    def input_range(self) -> tuple[float, float] | None:
        """The valid inputs as floats ``(low, high)``, or None (unbounded)."""
        r = self.config.input_range if self.data.input_range == FROM_CONFIG else self.data.input_range
        return None if r is None else (float(r[0]), float(r[1]))
