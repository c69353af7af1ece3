"""The decision rules behind every verdict of a reference file (``laplace_lab.reporting.reference``), as
plain functions of means, standard errors and counts, so that a reader can check each by hand.

- ``paper_decision``: a printed paper value against our mean: *reproduces the paper* when
  |ours - paper| <= 2 sqrt(se_paper^2 + se_ours^2) (or the stated tolerance + 2 se_ours where the paper
  prints no error bar), plus half a unit of the printed cell's last decimal (none for a cell printed
  without decimals), else *misses*.
- ``claim_decision``: an ordering the paper states, ``lhs op rhs``, on our two means (unpaired):
  with d = lhs - rhs and the 95 % interval d ± t se (t: Student's 0.975 quantile at the Welch
  degrees of freedom), *reproduces the paper* when the whole interval lies on the claimed side,
  *fails* when it lies wholly on the other side, *inconclusive* otherwise, whatever the operator
  (``<=`` counts like ``<``). A non-inferiority claim ("not worse by more than m", ``>=``/``<=`` with a
  ``margin`` m fixed in the reference row) moves the boundary from 0 to -m (``>=``) or +m (``<=``).
  A side without a standard error (one run) is *inconclusive*: no noise estimate.
- ``peer_decision``: ours against a peer's code, paired seed by seed (d_s = ours_s - theirs_s): an
  equivalence test: *matches* when the 95 % interval mean(d) ± t_{n-1} se(d) lies inside
  [-margin, +margin], *misses* when it lies wholly outside, *inconclusive* otherwise or with fewer
  than ``MIN_PAIRS`` paired seeds.
"""

from __future__ import annotations

import math

from scipy import stats

REPRODUCES = "reproduces the paper"
MISSES = "misses"
FAILS = "fails"
INCONCLUSIVE = "inconclusive"
NOT_RUN = "not run"
CHECK = "check"
MIN_PAIRS = 3
LEVEL = 0.95


def t_quantile(df: float) -> float:
    """Student's t quantile of the two-sided ``LEVEL`` interval (0.975 for 95 %) at ``df`` degrees of
    freedom (inf: the normal 1.95996...). ``df`` must be > 0."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    return float(stats.t.ppf(0.5 + LEVEL / 2, df))


def welch_df(se1: float, n1: int, se2: float, n2: int) -> float:
    """Welch-Satterthwaite degrees of freedom of the difference of two means with standard errors
    ``se1``, ``se2`` over ``n1``, ``n2`` runs (each n >= 2); ``min(n) - 1`` when both se are 0."""
    v1, v2 = se1 ** 2, se2 ** 2
    denominator = v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1)
    return (v1 + v2) ** 2 / denominator if denominator > 0 else float(min(n1, n2) - 1)


def half_unit(printed_value: str) -> float:
    """Half a unit of the last printed decimal of a printed number ("0.894" -> 0.0005); 0 for a
    number printed without decimals ("1", "12"): such cells are limits or counts, not roundings."""
    if "." not in printed_value:
        return 0.0
    return 0.5 * 10.0 ** -len(printed_value.split(".")[1])


def paper_decision(ours: float, ours_se: float, paper: float, paper_se: float | None, tolerance: float | None,
                   half: float) -> tuple[str, float]:
    """(verdict, allowed |ours - paper|) of a printed paper value (se: standard errors; ``ours_se``
    NaN for one run counts 0; ``paper_se`` None where the paper prints no error bar, then
    ``tolerance`` is the stated one)."""
    se = ours_se if math.isfinite(ours_se) else 0.0
    allowed = (2.0 * math.hypot(paper_se, se) if paper_se is not None else tolerance + 2.0 * se) + half
    return (REPRODUCES if abs(ours - paper) <= allowed else MISSES), allowed


def claim_decision(op: str, lhs: tuple[float, float, int], rhs: tuple[float, float, int],
                   margin: float = 0.0) -> tuple[str, str]:
    """(verdict, how it was judged) of the claim ``lhs op rhs`` on (mean, se, n) of our two sides;
    ``margin`` > 0 makes ``<=``/``>=`` a non-inferiority claim ("not worse by more than margin")."""
    (m1, se1, n1), (m2, se2, n2) = lhs, rhs
    if op not in ("<", "<=", ">", ">="):
        raise ValueError(f"op must be one of <, <=, >, >=; got {op!r}")
    if margin and op in ("<", ">"):
        raise ValueError(f"a margin makes a non-inferiority claim, which needs op <= or >=; got {op!r}")
    if n1 < 2 or n2 < 2 or not (math.isfinite(se1) and math.isfinite(se2)):
        return INCONCLUSIVE, f"n = {n1} vs {n2}: a side with one run has no noise estimate"
    d, se = m1 - m2, math.hypot(se1, se2)
    t = t_quantile(welch_df(se1, n1, se2, n2))
    low, high = d - t * se, d + t * se
    bound = -margin if op in (">", ">=") else margin
    text = (f"d = {d:.4g}, 95% interval [{low:.4g}, {high:.4g}] (t = {t:.3g}, Welch)"
            + (f"; non-inferiority margin {margin:.4g}" if margin else ""))
    if op in (">", ">="):
        verdict = REPRODUCES if low > bound else FAILS if high < bound else INCONCLUSIVE
    else:
        verdict = REPRODUCES if high < bound else FAILS if low > bound else INCONCLUSIVE
    return verdict, text


def peer_decision(mean: float, se: float, n: int, margin: float, matches: str) -> tuple[str, str]:
    """(verdict, how it was judged) of the paired differences ours - theirs (mean, se, n pairs)
    against the equivalence ``margin``; ``matches`` is the verdict's name when equivalent (it says
    whose code: the authors' or laplace-torch)."""
    if n < MIN_PAIRS or not math.isfinite(se):
        return INCONCLUSIVE, f"{n} paired seed(s): an equivalence test needs >= {MIN_PAIRS}"
    t = t_quantile(n - 1)
    low, high = mean - t * se, mean + t * se
    text = f"95% interval [{low:.4g}, {high:.4g}] (t_{n - 1} = {t:.3g}) vs margin ±{margin:.4g}"
    if -margin <= low and high <= margin:
        return matches, text
    if low > margin or high < -margin:
        return MISSES, text
    return INCONCLUSIVE, text


def identical(differences: list[float], scale: float) -> bool:
    """True when every paired difference is below 1e-6 of ``scale`` (the values' magnitude, at least
    1): both sides computed the same thing, a check rather than a comparison."""
    return bool(differences) and max(abs(d) for d in differences) <= 1e-6 * max(1.0, scale)
