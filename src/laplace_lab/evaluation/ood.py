"""Generated out-of-distribution inputs (Kristiadi, Hein & Hennig 2020; Hein et al. 2019).

- ``uniform_noise``: i.i.d. uniform pixels in the valid input range, same shape as the data.
- ``far_away``: our choice of far-away inputs is ``alpha * x`` for in-distribution test inputs
  ``x`` (default ``alpha = 100``). Along such rays a ReLU network's logits grow linearly, so its
  softmax confidence tends to 1 (Hein et al. 2019, Thm. 3.1), which is the failure that
  (last-layer) Laplace fixes (Kristiadi et al. 2020, Thm. 2.3). The inputs deliberately leave
  ``input_range``; nothing is clamped.

The OOD metrics themselves (mean confidence, AUROC, FPR@95%TPR) are in ``metrics.ood_metrics``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def uniform_noise(n: int, shape: tuple[int, ...], input_range: tuple[float, float],
                  generator: torch.Generator | None = None) -> Tensor:
    """``[n, *shape]`` uniform noise in ``[low, high]``."""
    lo, hi = input_range
    return lo + (hi - lo) * torch.rand((n, *shape), generator=generator)


def far_away(x: Tensor, alpha: float) -> Tensor:
    """``alpha * x``: in-distribution inputs scaled far from the data (``alpha >> 1``)."""
    return alpha * x
