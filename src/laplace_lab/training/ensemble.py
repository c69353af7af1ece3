"""Deep ensembles and mixtures of Laplace approximations (MoLA; Eschenhagen et al. 2021).

``ensemble.enabled=true`` (``method=deep_ensemble``, ``method=mola``) trains ``ensemble.size``
MAP networks ("members") one after another in this process and evaluates the uniform mixture of
their predictives beside member 0's: predictors ``map`` and ``la`` are member 0's plug-in and
Laplace predictive, ``de`` the mixture of the members' plug-in predictives and ``mola`` the
mixture of their Laplace predictives (only when a post-hoc Laplace is configured).

Seeds: member ``k`` of a run with seed ``s`` is trained exactly like a single-model run with
seed ``member_seed(s, k) = s + k * ensemble.seed_stride`` (the data split and shuffling follow
the seed too), so member 0 is the run's own network and every member is shared with the single
runs of those seeds through the MAP cache (``map_cache.enabled``). With the default stride 1000,
the ensembles of seeds 0..999 have disjoint members.

``ensemble.member=k`` makes the job train (or find in the cache) member ``k`` only, with no
Laplace and no evaluation: a launcher can train the members in parallel, one job each, and the
ensemble job then loads all of them from the cache.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from laplace_lab.config.load import replaced
from laplace_lab.config.schema import RunConfig
from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.training.posthoc import fit_posthoc_laplace
from laplace_lab.training.predictors import laplace_predictor, map_predictor, mixture_predictor

log = logging.getLogger(__name__)
# train_map(run, output_dir, loggers) -> (datamodule, module, trainer, metrics): training.fit.train_map
TrainFn = Callable


def member_seed(seed: int, k: int, stride: int) -> int:
    """Seed of member ``k``: ``seed + k * stride`` (member 0 keeps the run's seed)."""
    return int(seed) + int(k) * int(stride)


def member_config(run: RunConfig, k: int) -> RunConfig:
    """The single-model config of member ``k``: the run's config with the member's seed (and what
    follows it, e.g. ``data.seed: ${seed}``)."""
    return replaced(run, {"seed": member_seed(run.seed, k, run.ensemble.seed_stride)})


def run_member_job(run: RunConfig, output_dir: Path, train_fn: TrainFn) -> dict[str, float]:
    """``ensemble.member=k``: train member ``k`` into the MAP cache; no Laplace, no evaluation."""
    k = int(run.ensemble.member)
    _, _, _, metrics = train_fn(member_config(run, k), output_dir, [])
    metrics = {**metrics, "ensemble/member": float(k), "ensemble/member_seed": float(member_seed(
        run.seed, k, run.ensemble.seed_stride))}
    write_text_atomic(output_dir / "metrics.json", json.dumps(metrics, indent=2))
    return metrics


def fit_members(run: RunConfig, output_dir: Path, member0, la0, train_fn: TrainFn) -> tuple[dict, dict]:
    """Train members ``1..K-1`` (member 0 is the run's own ``(module, la)``), fit each one's
    Laplace if configured, and build the mixture predictors.

    Returns ``({"de": ..., "mola": ...}, metrics)``; ``mola`` only with a post-hoc Laplace.
    Metrics: ``ensemble/size``, ``ensemble/fit_s`` (training and Laplace fits of members 1..K-1),
    ``ensemble/cache_hits`` (members 1..K-1 loaded from the MAP cache)
    and per member ``ensemble/member<k>/val_nll`` when validation ran.
    """
    task = "classification" if member0.likelihood == "classification" else "regression"
    modules, laplaces = [member0], [la0]
    metrics = {"ensemble/size": float(run.ensemble.size), "ensemble/fit_s": 0.0, "ensemble/cache_hits": 0.0}
    for k in range(1, int(run.ensemble.size)):
        mcfg = member_config(run, k)
        datamodule, module, _, m = train_fn(mcfg, output_dir / f"member_{k}", [])
        module.to(next(member0.parameters()).device)  # Lightning's teardown leaves it on the CPU
        metrics["ensemble/fit_s"] += m["time/fit_s"]
        metrics["ensemble/cache_hits"] += m.get("map_cache/hit", 0.0)
        if "val/nll" in m:
            metrics[f"ensemble/member{k}/val_nll"] = m["val/nll"]
        la = None
        if mcfg.needs_posthoc_laplace:
            la, la_metrics = fit_posthoc_laplace(mcfg, module, datamodule)
            metrics[f"ensemble/member{k}/prior_precision_mean"] = la_metrics["laplace/prior_precision_mean"]
            metrics["ensemble/fit_s"] += la_metrics["laplace/fit_time_s"]
        module.eval()
        modules.append(module)
        laplaces.append(la)
        log.info("ensemble member %d/%d ready (seed %d)", k + 1, run.ensemble.size, mcfg.seed)
    member0.eval()
    predictors = {"de": mixture_predictor([map_predictor(m) for m in modules], task)}
    if la0 is not None:
        predictors["mola"] = mixture_predictor([laplace_predictor(la, run.predictive) for la in laplaces], task)
    return predictors, metrics
