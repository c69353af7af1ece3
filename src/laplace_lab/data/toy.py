"""Generated data: 2-D classification (``toy2d``) and 1-D regression (``sinusoid``).

Both need no download, so the default experiment and the tests run anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.data import TensorDataset

from laplace_lab.data.base import LabDataModule
from laplace_lab.data.checks import check_finite
from laplace_lab.io.fields import option

TOY2D_KINDS = ("linear", "moons", "circles", "blobs")
TOY2D_CLASSES = {"linear": 2, "moons": 2, "circles": 2, "blobs": 4}  # labels: arange(n) % classes


def make_toy2d(kind: str, n: int, noise: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``X [n, 2]`` (float) and ``y [n]`` (long) for a 2-D classification problem.

    ``linear``: two linearly separable Gaussian clusters; ``moons``: two interleaved half
    circles; ``circles``: two concentric rings; ``blobs``: four Gaussian clusters (4 classes).
    """
    if kind not in TOY2D_KINDS:
        raise ValueError(f"data.kind={kind!r} is not supported; allowed: {list(TOY2D_KINDS)}")
    rand = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    if kind == "linear":
        y = torch.arange(n) % 2
        centers = torch.tensor([[-1.5, -1.5], [1.5, 1.5]])
        X = centers[y] + 0.6 * rand(n, 2)
    elif kind == "blobs":
        y = torch.arange(n) % 4
        centers = torch.tensor([[-2.0, -2.0], [2.0, -2.0], [-2.0, 2.0], [2.0, 2.0]])
        X = centers[y] + 0.6 * rand(n, 2)
    elif kind == "moons":
        y = torch.arange(n) % 2
        t = torch.rand(n, generator=generator) * math.pi
        X = torch.stack([torch.cos(t), torch.sin(t)], 1)
        X[y == 1] = torch.stack([1 - torch.cos(t[y == 1]), 0.5 - torch.sin(t[y == 1])], 1)
        X = X + noise * rand(n, 2)
    else:  # circles
        y = torch.arange(n) % 2
        t = torch.rand(n, generator=generator) * 2 * math.pi
        radius = torch.where(y == 1, 0.5, 1.0)
        X = radius[:, None] * torch.stack([torch.cos(t), torch.sin(t)], 1) + noise * rand(n, 2)
    return X.float(), y.long()


def make_sinusoid(n: int, noise_std: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The Laplace-Redux / laplace-torch toy: ``x ~ U(0, 8)``, ``y = sin(x) + noise_std * eps``.

    Returns ``X [n, 1]`` and ``y [n, 1]``.
    """
    X = torch.rand(n, 1, generator=generator) * 8
    y = torch.sin(X) + noise_std * torch.randn(n, 1, generator=generator)
    return X, y


class Toy2DDataModule(LabDataModule):
    """2-D classification with separate generated train / val / test draws."""

    @dataclass(frozen=True)
    class Options(LabDataModule.Options):
        kind: str = option("moons", "str", choices=TOY2D_KINDS)
        n_train: int = option(500, "int", low=1)
        n_val: int = option(200, "int", low=0)
        n_test: int = option(500, "int", low=1)
        noise: float = option(0.1, "float", low=0)

    task = "classification"
    input_shape = (2,)
    in_memory = True

    @classmethod
    def check_sizes(cls, options: Options) -> None:
        """``data.n_train`` at least the classes of ``data.kind`` (labels cycle through the classes:
        fewer training points would train a network with fewer outputs than the problem has)."""
        classes = TOY2D_CLASSES[options.kind]
        if options.n_train < classes:
            raise ValueError(f"data.n_train={options.n_train} is too small for data.kind={options.kind!r}, which has "
                             f"{classes} classes (each needs a training point); allowed: integers >= {classes}")

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        g = torch.Generator().manual_seed(self.seed)
        self.kind = o.kind
        splits = [make_toy2d(o.kind, n, o.noise, g) for n in (o.n_train, o.n_val, o.n_test)]
        for X, _ in splits:
            check_finite(X, "inputs", f"generated toy2d data (data.kind={o.kind!r}, data.noise={o.noise})")
        self.num_outputs = int(splits[0][1].max()) + 1
        self.train_set, self.val_set, self.test_set = (TensorDataset(*s) for s in splits)
        self.train_tensors = splits[0]


class SinusoidDataModule(LabDataModule):
    """1-D regression: N=150 training points with noise std 0.3 by default; test on a dense grid.

    Targets are not standardised (``target_mean=0``, ``target_std=1``), so sigma is in data units.
    """

    @dataclass(frozen=True)
    class Options(LabDataModule.Options):
        n_train: int = option(150, "int", low=1)
        n_val: int = option(50, "int", low=0)
        n_test: int = option(500, "int", low=1)
        noise_std: float = option(0.3, "float", low=0)

    task = "regression"
    input_shape = (1,)
    num_outputs = 1
    in_memory = True

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        g = torch.Generator().manual_seed(self.seed)
        self.noise_std = o.noise_std
        splits = [make_sinusoid(n, o.noise_std, g) for n in (o.n_train, o.n_val, o.n_test)]
        for _, y in splits:
            check_finite(y, "targets", f"generated sinusoid data (data.noise_std={o.noise_std})")
        self.train_set, self.val_set, self.test_set = (TensorDataset(*s) for s in splits)
        self.target_mean, self.target_std = torch.zeros(1), torch.ones(1)
