"""Model selection by marginal likelihood: does the log marglik rank candidate models as the
held-out metrics do? A section of a results table (``aggregate.model_selection``).

Spec (all keys but ``where`` and ``lower_is_better`` required)::

    model_selection:
      score: laplace/log_marglik            # the selection criterion, higher is better
      candidates: [model._target_]          # keys that name a candidate (e.g. the architecture)
      within: [data.name]                   # one ranking per value of these keys
      targets: [test/la/acc, test/la/nll]   # held-out metrics to compare the ranking with
      where: {method_name: online_kron}     # optional: only runs with these values
      lower_is_better: [my_loss]            # optional: metric-name parts where lower is better

A target's direction (which value is better) is its registered metric's
(``evaluation.metric_registry``; coverage: closer to the nominal level; a derived ``mean(<pattern>)``:
its pattern's metric), a metric whose name contains a ``lower_is_better`` part is lower-is-better, and
an unregistered one (e.g. a ``laplace/...`` key) higher-is-better.

Per ``within`` group the candidates' means over runs are ranked by ``score`` and by each target;
the agreement is Kendall's tau (+1: same order, -1: reversed) and whether the score's best
candidate is the target's best. Its spread: the same tau computed seed by seed (the runs sharing
the values of ``seed_keys``, e.g. ``seed``), over the seeds every candidate of the group ran,
as mean, standard error and number of seeds.

With the score ``laplace/log_marglik``, a group whose runs all record the evidence's terms
(``laplace/log_lik``, ``laplace/log_det_ratio``, ``laplace/scatter``; log marglik = log_lik -
0.5 (log_det_ratio + scatter)) also shows their means and the Occam term -0.5 (log_det_ratio +
scatter) beside the score: why the score ranks the candidates as it does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from laplace_lab.reporting.derived_metrics import DERIVED
from laplace_lab.reporting.summary_stats import mean_se

SPEC_KEYS = ("score", "candidates", "within", "targets", "where", "lower_is_better")
EVIDENCE = "laplace/log_marglik"
EVIDENCE_TERMS = ("laplace/log_lik", "laplace/log_det_ratio", "laplace/scatter")
OCCAM = "occam"  # -0.5 (log_det_ratio + scatter), per run


def validate_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with defaults; unknown or missing keys raise a ValueError naming them."""
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"aggregate.model_selection has unknown keys {unknown}; allowed: {list(SPEC_KEYS)}")
    missing = [k for k in ("score", "candidates", "within", "targets") if not spec.get(k)]
    if missing:
        raise ValueError(f"aggregate.model_selection needs {missing}")
    spec = {"where": {}, "lower_is_better": [], **spec}
    for target in spec["targets"]:
        orientation(target, tuple(spec["lower_is_better"]))  # no better direction: refused before any run
    return spec


def orientation(metric: str, lower: tuple[str, ...] = ()) -> Callable[[float], float]:
    """``value -> goodness`` (higher is better) of a target metric (direction: module docstring);
    a ValueError for a registered metric with no better side (e.g. the test set's mean confidence)."""
    # imported here: the registry's metrics import torch (needed at aggregation, not before)
    from laplace_lab.evaluation.metric_registry import lookup

    name = metric.rsplit("/", 1)[-1].lower()
    if any(part in name for part in lower):
        return lambda v: -v
    derived = DERIVED.match(metric)
    registered = lookup(derived["pattern"] if derived else metric)
    if registered is None:
        return lambda v: v
    if registered.direction is None:
        raise ValueError(f"aggregate.model_selection target {metric!r}: {registered.label} has no better "
                         "direction to rank by; choose another target or name it in lower_is_better")
    return registered.goodness


def higher_is_better(metric: str, lower: tuple[str, ...] = ()) -> bool:
    """Whether a larger value of ``metric`` is better (``test/la/nll`` -> False; ``orientation``)."""
    return orientation(metric, lower)(1.0) > orientation(metric, lower)(0.0)


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two equally long score lists (NaN for fewer than 2 items)."""
    n = len(a)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return math.nan
    s = sum(math.copysign(1, (a[i] - a[j]) * (b[i] - b[j])) if (a[i] - a[j]) * (b[i] - b[j]) else 0
            for i, j in pairs)
    return s / len(pairs)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _agreement(score: list[float], target: list[float], orient: Callable[[float], float]) -> tuple[float, bool | None]:
    """(Kendall tau, whether the best by score is the best by target) over the finite pairs
    (``orient``: a target value as goodness, higher is better)."""
    target = [orient(v) for v in target]
    ok = [i for i in range(len(score)) if math.isfinite(score[i]) and math.isfinite(target[i])]
    tau = kendall_tau([score[i] for i in ok], [target[i] for i in ok])
    top = (max(ok, key=lambda i: score[i]) == max(ok, key=lambda i: target[i])) if ok else None
    return tau, top


def _per_seed_tau(cands: dict[tuple, list], metric: str, score: str, orient: Callable[[float], float],
                  seed_keys: tuple[str, ...]) -> list[float]:
    """Tau of ``metric`` vs ``score`` for each seed that every candidate ran (one run per seed)."""
    by_seed = [{tuple(r.value(k) for k in seed_keys): r for r in runs} for runs in cands.values()]
    common = sorted(set.intersection(*(set(s) for s in by_seed))) if by_seed else []
    taus = []
    for seed in common:
        runs = [s[seed] for s in by_seed]
        tau, _ = _agreement([r.metrics.get(score, math.nan) for r in runs],
                            [r.metrics.get(metric, math.nan) for r in runs], orient)
        if math.isfinite(tau):
            taus.append(tau)
    return taus


def rank_candidates(runs: list, spec: dict[str, Any], seed_keys: tuple[str, ...] = ("seed",)) -> list[dict[str, Any]]:
    """One entry per ``within`` group: candidates with mean score/targets, tau and top agreement,
    and per target ``per_seed`` = (mean, se, n) of the tau of each seed in ``seed_keys``.

    ``runs`` are ``tables.Run`` objects (``value(key)`` and ``metrics``)."""
    spec = validate_spec(spec)
    lower = tuple(spec["lower_is_better"])
    chosen = [r for r in runs if all(r.value(k) == str(v) for k, v in spec["where"].items())]
    groups: dict[tuple, dict[tuple, list]] = {}
    for r in chosen:
        within = tuple(r.value(k) for k in spec["within"])
        cand = tuple(r.value(k) for k in spec["candidates"])
        groups.setdefault(within, {}).setdefault(cand, []).append(r)
    out = []
    for within, cands in groups.items():
        names = list(cands)
        terms = _recorded_terms(spec["score"], [r for c in names for r in cands[c]])
        means = {m: [_mean([r.metrics[m] for r in cands[c] if m in r.metrics]) for c in names]
                 for m in [spec["score"], *terms, *spec["targets"]]}
        if terms:
            means[OCCAM] = [_mean([-0.5 * (r.metrics["laplace/log_det_ratio"] + r.metrics["laplace/scatter"])
                                   for r in cands[c]]) for c in names]
        score = means[spec["score"]]
        agreement, per_seed = {}, {}
        for t in spec["targets"]:
            orient = orientation(t, lower)
            tau, top = _agreement(score, means[t], orient)
            agreement[t] = {"kendall_tau": tau, "top_agrees": top}
            per_seed[t] = mean_se(_per_seed_tau(cands, t, spec["score"], orient, tuple(seed_keys)))
        out.append({"within": dict(zip(spec["within"], within)),
                    "candidates": [dict(zip(spec["candidates"], c)) for c in names],
                    "n_runs": [len(cands[c]) for c in names], "means": means, "agreement": agreement,
                    "terms": [*terms, OCCAM] if terms else [],
                    "per_seed": per_seed})
    return out


def _recorded_terms(score: str, runs: list) -> list[str]:
    """The evidence's terms when the score is the Laplace evidence and every run records them."""
    if score != EVIDENCE or not all(all(t in r.metrics for t in EVIDENCE_TERMS) for r in runs):
        return []
    return list(EVIDENCE_TERMS)


def _fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.1f}" if abs(x) >= 1000 else f"{x:.4f}"


def to_markdown(rankings: list[dict[str, Any]], spec: dict[str, Any]) -> list[str]:
    """Markdown lines of the model-selection section."""
    spec = validate_spec(spec)
    where = ", ".join(f"{k}={v}" for k, v in spec["where"].items())
    lines = ["", "## Model selection by marginal likelihood", "",
             f"Candidates ({', '.join(spec['candidates'])}) ranked by `{spec['score']}` (higher is better)"
             + (f" over the runs with {where}" if where else "") + ", beside held-out metrics (means over runs). "
             "Kendall's tau: +1 = the score orders the candidates as the metric does, -1 = reversed.", ""]
    for entry in rankings:
        metrics = [spec["score"], *entry.get("terms", []), *spec["targets"]]
        title = ", ".join(f"{k}={v}" for k, v in entry["within"].items()) or "all runs"
        lines += [f"### {title}", "", "| " + " | ".join([*spec["candidates"], "n", *metrics]) + " |",
                  "|" + "---|" * (len(spec["candidates"]) + 1 + len(metrics))]
        order = sorted(range(len(entry["candidates"])), key=lambda i: -entry["means"][spec["score"]][i]
                       if math.isfinite(entry["means"][spec["score"]][i]) else math.inf)
        for i in order:
            cells = [*entry["candidates"][i].values(), str(entry["n_runs"][i]),
                     *(_fmt(entry["means"][m][i]) for m in metrics)]
            lines.append("| " + " | ".join(cells) + " |")
        agree = "; ".join(f"{t}: tau {_fmt(a['kendall_tau'])}, best agrees: {a['top_agrees']}"
                          for t, a in entry["agreement"].items())
        spread = "; ".join(f"{t}: {_fmt(m)} ± {_fmt(se)} (n={n})" for t, (m, se, n) in entry["per_seed"].items())
        if entry.get("terms"):
            lines += ["", f"The evidence's terms (means): `{spec['score']}` = `laplace/log_lik` + `{OCCAM}`, "
                      f"`{OCCAM}` = -0.5 (`laplace/log_det_ratio` + `laplace/scatter`)."]
        lines += ["", f"Agreement with `{spec['score']}`: {agree}", "",
                  f"Tau seed by seed (mean ± s.e. over the seeds every candidate ran): {spread}", ""]
    return lines
