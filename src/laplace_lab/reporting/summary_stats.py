"""Mean and standard error of a sample: the one summary the tables, the model-selection section
and the peer scripts report."""

from __future__ import annotations

import math


def mean_se(values: list[float]) -> tuple[float, float, int]:
    """Mean, standard error (sample std / sqrt(n); NaN for n < 2) and n of ``values`` (NaN mean for
    none)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = math.fsum(values) / n
    se = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1) / n) if n > 1 else math.nan
    return mean, se, n
