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

from omegaconf import DictConfig, OmegaConf

from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.training.posthoc import fit_posthoc_laplace, needs_posthoc_laplace
from laplace_lab.training.predictors import laplace_predictor, map_predictor, mixture_predictor

log = logging.getLogger(__name__)
# train_map(cfg, output_dir, loggers) -> (datamodule, module, trainer, metrics), from laplace_lab.train
TrainFn = Callable


def enabled(cfg: DictConfig) -> bool:
    return bool(OmegaConf.select(cfg, "ensemble.enabled", default=False))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def validate_ensemble_config(cfg: DictConfig) -> None:
    """Reject invalid ``ensemble.*`` options and combinations before any work."""
    ens = cfg.get("ensemble")
    if ens is None:
        return
    _require(isinstance(ens.enabled, bool), f"ensemble.enabled must be true or false; got {ens.enabled!r}")
    size, stride, member = ens.size, ens.seed_stride, ens.get("member")
    _require(isinstance(size, int) and not isinstance(size, bool) and size >= 1,
             f"ensemble.size must be a positive integer; got {size!r}")
    _require(isinstance(stride, int) and not isinstance(stride, bool) and stride >= 1,
             f"ensemble.seed_stride must be a positive integer; got {stride!r}")
    if member is not None:
        _require(ens.enabled, "ensemble.member needs ensemble.enabled=true (e.g. method=deep_ensemble or method=mola)")
        _require(isinstance(member, int) and not isinstance(member, bool) and 0 <= member < size,
                 f"ensemble.member must be null or an integer in [0, ensemble.size={size}); got {member!r}")
        _require(bool(cfg.map_cache.enabled) and cfg.marglik.mode != "online",
                 "ensemble.member=<k> only trains member k into the MAP cache: it needs map_cache.enabled=true "
                 f"and marglik.mode in ['off', 'posthoc']; got map_cache.enabled={cfg.map_cache.enabled}, "
                 f"marglik.mode={cfg.marglik.mode!r}")
    if not ens.enabled:
        return
    _require(not cfg.get("map_grid"),
             "map_grid is not supported with ensemble.enabled=true; allowed: map_grid=null (set prior.prior_precision)")
    _require(member is not None or not cfg.checkpoint.resume_from,
             "checkpoint.resume_from resumes one network; with ensemble.enabled=true it is only allowed for a "
             "single-member job (ensemble.member=<k>)")


def member_seed(seed: int, k: int, stride: int) -> int:
    """Seed of member ``k``: ``seed + k * stride`` (member 0 keeps the run's seed)."""
    return int(seed) + int(k) * int(stride)


def member_config(cfg: DictConfig, k: int) -> DictConfig:
    """The single-model config of member ``k``: the run's config with the member's seed."""
    member = cfg.copy()
    member.seed = member_seed(cfg.seed, k, cfg.ensemble.seed_stride)
    return member


def run_member_job(cfg: DictConfig, output_dir: Path, train_fn: TrainFn) -> dict[str, float]:
    """``ensemble.member=k``: train member ``k`` into the MAP cache; no Laplace, no evaluation."""
    k = int(cfg.ensemble.member)
    _, _, _, metrics = train_fn(member_config(cfg, k), output_dir, [])
    metrics = {**metrics, "ensemble/member": float(k), "ensemble/member_seed": float(member_seed(
        cfg.seed, k, cfg.ensemble.seed_stride))}
    write_text_atomic(output_dir / "metrics.json", json.dumps(metrics, indent=2))
    return metrics


def fit_members(cfg: DictConfig, output_dir: Path, member0, la0, train_fn: TrainFn) -> tuple[dict, dict]:
    """Train members ``1..K-1`` (member 0 is the run's own ``(module, la)``), fit each one's
    Laplace if configured, and build the mixture predictors.

    Returns ``({"de": ..., "mola": ...}, metrics)``; ``mola`` only with a post-hoc Laplace.
    Metrics: ``ensemble/size``, ``ensemble/fit_s`` (training and Laplace fits of members 1..K-1),
    ``ensemble/cache_hits`` (members 1..K-1 loaded from the MAP cache)
    and per member ``ensemble/member<k>/val_nll`` when validation ran.
    """
    task = "classification" if member0.likelihood == "classification" else "regression"
    modules, laplaces = [member0], [la0]
    metrics = {"ensemble/size": float(cfg.ensemble.size), "ensemble/fit_s": 0.0, "ensemble/cache_hits": 0.0}
    for k in range(1, int(cfg.ensemble.size)):
        mcfg = member_config(cfg, k)
        datamodule, module, _, m = train_fn(mcfg, output_dir / f"member_{k}", [])
        module.to(next(member0.parameters()).device)  # Lightning's teardown leaves it on the CPU
        metrics["ensemble/fit_s"] += m["time/fit_s"]
        metrics["ensemble/cache_hits"] += m.get("map_cache/hit", 0.0)
        if "val/nll" in m:
            metrics[f"ensemble/member{k}/val_nll"] = m["val/nll"]
        la = None
        if needs_posthoc_laplace(mcfg):
            la, la_metrics = fit_posthoc_laplace(mcfg, module, datamodule)
            metrics[f"ensemble/member{k}/prior_precision_mean"] = la_metrics["laplace/prior_precision_mean"]
            metrics["ensemble/fit_s"] += la_metrics["laplace/fit_time_s"]
        module.eval()
        modules.append(module)
        laplaces.append(la)
        log.info("ensemble member %d/%d ready (seed %d)", k + 1, cfg.ensemble.size, mcfg.seed)
    member0.eval()
    predictors = {"de": mixture_predictor([map_predictor(m) for m in modules], task)}
    if la0 is not None:
        predictors["mola"] = mixture_predictor([laplace_predictor(la, cfg.predictive) for la in laplaces], task)
    return predictors, metrics
