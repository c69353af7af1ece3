"""Peer reference for the ``redux_mnist`` table: laplace-torch 0.3 (the authors' library) run
post hoc on the same MAP networks as our jobs, evaluated by our own metric code.

For every seed of a finished (or running) ``redux_mnist`` sweep, the script rebuilds the job's
data module and LeNet from its ``config_resolved.yaml``, loads the seed's MAP network from the
MAP cache (``laplace_lab.training.map_cache``) and fits laplace-torch as the authors'
``uq.py`` does with ``configs/post_hoc_laplace/mnist_{default,bestood}.yaml`` (runame/laplace-redux):

=========  ===========================================  =====================  =================
method     laplace-torch                                prior (marglik)        predictive
=========  ===========================================  =====================  =================
la         last layer, KFAC, ``BackPackGGN``            scalar                 GLM, probit
la_star    last layer, full, ``BackPackEF``             scalar                 GLM, probit
kron       all weights, KFAC, ``BackPackGGN``           layerwise (as ours)    GLM, probit
=========  ===========================================  =====================  =================

Curvature on the job's training images (batch 512, the authors' ``batch_size``), then
``optimize_prior_precision(method="marglik")`` from prior precision 1 (the authors'
``prior_precision: 1.``) with laplace-torch's default 100 Adam steps at lr 0.1 on the log
precision (the authors pass no ``n_steps``/``lr``). Evaluation is ``laplace_lab.evaluation``'s
``run_evaluation`` with the job's ``evaluation`` config (rotation, CIFAR-10-C and attacks off),
so test accuracy / NLL / ECE / Brier on the 10k test images, FashionMNIST and uniform-noise OOD
(same noise draw: the evaluation seed) are the numbers our jobs report, computed the same way.
The MAP predictive is evaluated beside it; when the job has finished, its ``test/map/*`` and
``ood/fashion_mnist/map/conf`` must equal ours (else the wrong network was found: an error).

Locating the MAP network: each job folder of ``--sweep-dir`` holds ``config_resolved.yaml``;
the cache folder is the job's ``map_cache.dir`` (relative paths: relative to the launch folder
recorded in the sweep's ``launches.jsonl``; ``--map-cache-dir`` overrides). The entry is the
file named by the job's cache key (``map_cache.cache_key``) when the code is the same; else the
unique entry whose ``<key>.json`` has the same training config and data files (the code hash
left out, so a later checkout finds the MAP networks of an earlier commit). None, or several:
an error naming the candidates. The job's config is rebuilt with today's code (``training.build.build``);
root options added to ``conf/train.yaml`` after the sweep's commit (e.g. ``map_loss_scale``) are
filled in with today's defaults for the rebuild (named on stdout), never for the cache lookup.

One row per (seed, method) in a CSV; rows already there are skipped (resumable).
``--summary`` prints mean +- s.e. per method (our jobs' beside, from their ``metrics.json``)
and reference.yaml entries. laplace-torch is used as a library only.

    PYTHONPATH=src python experiments/redux_mnist/laplace_torch_reference.py \\
        --sweep-dir outputs/redux_mnist/multirun --summary
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import tempfile
import time
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from laplace_lab.evaluation import EvalData, EvaluationPlan, run_evaluation
from laplace_lab.evaluation import options as eval_options
from laplace_lab.reporting import peer_csv
from laplace_lab.reporting.summary_stats import mean_se
from laplace_lab.sweeps.run_only import strip_run_only
from laplace_lab.training import map_cache
from laplace_lab.training.predictors import map_predictor

# laplace-torch settings per method (our method_name): the authors' LA and LA*, and our kron.
METHODS = {
    "la": {"subset_of_weights": "last_layer", "hessian_structure": "kron", "curvature": "ggn",
           "prior_structure": "scalar"},
    "la_star": {"subset_of_weights": "last_layer", "hessian_structure": "full", "curvature": "ef",
                "prior_structure": "scalar"},
    "kron": {"subset_of_weights": "all", "hessian_structure": "kron", "curvature": "ggn",
             "prior_structure": "layerwise"},
}
# The preset's table metrics (experiments/redux_mnist/preset.yaml ``aggregate.metrics``), same keys.
METRICS = ["test/map/acc", "test/la/acc", "test/map/nll", "test/la/nll", "test/map/ece", "test/la/ece",
           "test/map/brier", "test/la/brier", "ood/fashion_mnist/map/conf", "ood/fashion_mnist/la/conf",
           "ood/fashion_mnist/map/auroc", "ood/fashion_mnist/la/auroc", "ood/fashion_mnist/map/fpr95",
           "ood/fashion_mnist/la/fpr95", "ood/noise/map/conf", "ood/noise/la/conf", "ood/noise/map/auroc",
           "ood/noise/la/auroc"]
PEER = ["peer/prior_precision", "peer/prior_precision_mean", "peer/log_marglik", "peer/fit_s",
        "peer/marglik_s", "peer/eval_s"]
FIELDS = ["seed", "method_name", "job", "map_entry", "map_found_by", *METRICS, *PEER]
# MAP metrics that must equal the job's (same network, same data, same code path)
MAP_CHECK = ["test/map/acc", "test/map/nll", "test/map/ece", "ood/fashion_mnist/map/conf"]
MAP_CHECK_TOL = 1e-4
DEFAULT_OUT = Path(__file__).with_name("laplace_torch_reference.csv")
COMMAND = "python experiments/redux_mnist/laplace_torch_reference.py --sweep-dir outputs/redux_mnist/multirun"
FIT_BATCH_SIZE = 512  # the authors' batch_size in mnist_{default,bestood}.yaml


# ---------------------------------------------------------------------------- laplace-torch
def fit_peer(model: torch.nn.Module, train_loader, method: str, prior_init: float = 1.0, n_steps: int = 100,
             lr: float = 0.1):
    """laplace-torch ``Laplace`` of a copy of ``model`` (logits ``[B, C]``), fitted on
    ``train_loader`` (``(x, y)`` batches with ``.dataset``) and its prior precision tuned by
    marglik from ``prior_init``. Returns ``(la, info)``; ``info`` holds the ``peer/*`` fields
    but ``peer/eval_s``."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not supported; allowed: {list(METHODS)}")
    from laplace import Laplace
    from laplace.curvature import BackPackEF, BackPackGGN

    spec = METHODS[method]
    backend = BackPackGGN if spec["curvature"] == "ggn" else BackPackEF
    la = Laplace(copy.deepcopy(model).eval(), "classification", subset_of_weights=spec["subset_of_weights"],
                 hessian_structure=spec["hessian_structure"], prior_precision=prior_init, backend=backend)
    start = time.perf_counter()
    la.fit(train_loader)
    fit_s = time.perf_counter() - start
    la.optimize_prior_precision(pred_type="glm", method="marglik", n_steps=n_steps, lr=lr,
                                init_prior_prec=prior_init, prior_structure=spec["prior_structure"],
                                link_approx="probit")
    marglik_s = time.perf_counter() - start - fit_s
    prior = la.prior_precision.detach().reshape(-1)
    with torch.no_grad():
        log_marglik = float(la.log_marginal_likelihood())
    return la, {"peer/prior_precision": " ".join(f"{float(v):.6g}" for v in prior),
                "peer/prior_precision_mean": float(prior.mean()), "peer/log_marglik": log_marglik,
                "peer/fit_s": fit_s, "peer/marglik_s": marglik_s}


def peer_predictor(la):
    """``x -> probs [B, C]``: laplace-torch's GLM predictive with the probit link."""
    return lambda x: la(x, pred_type="glm", link_approx="probit")


def evaluation_config(job_evaluation) -> DictConfig:
    """The job's ``evaluation`` node with what the table does not use switched off (rotation,
    CIFAR-10-C, attacks, figures, progress bars); test and OOD settings unchanged."""
    cfg = OmegaConf.create(OmegaConf.to_container(job_evaluation, resolve=True))
    cfg.progress = False
    cfg.reliability_diagram = False
    cfg.shift.rotation.enabled = False
    cfg.shift.cifar10c.enabled = False
    cfg.adversarial.enabled = False
    return cfg


def peer_metrics(module, datamodule, method: str, eval_cfg, out_dir: Path, prior_init: float = 1.0,
                 n_steps: int = 100, lr: float = 0.1) -> dict:
    """Fit laplace-torch on ``module.model`` (a ``MAPModule``) with the data module's training
    images and evaluate MAP (``map``) and laplace-torch (``la``) with ``run_evaluation``.
    Returns the ``METRICS`` and ``PEER`` fields (every evaluation metric as well)."""
    module.eval()
    la, info = fit_peer(module.model, datamodule.train_eval_dataloader(FIT_BATCH_SIZE), method, prior_init,
                        n_steps, lr)
    start = time.perf_counter()
    data = EvalData(datamodule.test_dataloader(), datamodule.ood_dataloaders(),
                    dataset=getattr(datamodule, "name", None), input_range=datamodule.input_range)
    plan = EvaluationPlan(eval_options.evaluation_config(eval_cfg), "classification",
                          {"map": map_predictor(module), "la": peer_predictor(la)}, data, attack_model=module.model,
                          out_dir=out_dir)
    metrics = run_evaluation(plan)
    info["peer/eval_s"] = time.perf_counter() - start
    return {**metrics, **info}


# ---------------------------------------------------------------------------- locating MAP networks
def _jsonable(obj):
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _strip(config: dict) -> dict:
    """A cache key's config without today's deny-listed keys (an entry written by older code may
    keep a key that has since become run-only or post-hoc-only)."""
    return strip_run_only(config, map_cache.DENY_KEYS, map_cache.DENY_SUBKEYS)


def same_data_files(have, want) -> str | None:
    """How an entry's ``data_files`` match the job's ``[relative path, size, sha256]`` list:
    ``"config"`` (equal), ``"config, older data fingerprint"`` (an entry of the older format
    ``[absolute path, size, mtime_ns]`` with the same files, i.e. paths ending in the relative ones,
    and sizes: the contents cannot be compared, ``check_map`` then guards the network), else ``None``."""
    if have == want:
        return "config"
    older = (isinstance(have, list) and len(have) == len(want)
             and all(isinstance(h, list) and len(h) == 3 and isinstance(h[2], int) for h in have))
    if older and all(Path(h[0]).parts[-len(Path(w[0]).parts):] == Path(w[0]).parts and h[1] == w[1]
                     for h, w in zip(sorted(have), sorted(want))):
        return "config, older data fingerprint"
    return None


def find_entry(contents: dict, key: str, cache_dir: Path) -> tuple[Path, str]:
    """The cache entry of a job whose ``map_cache.key_contents`` are ``contents`` and key ``key``:
    ``<key>.pt`` ("exact"), else the unique ``<k>.pt`` whose ``<k>.json`` has the same
    ``config`` and data files (``same_data_files``; the code hash may differ). Returns ``(path, how)``."""
    exact = cache_dir / f"{key}.pt"
    if exact.exists():
        return exact, "exact"
    want = _jsonable({"config": _strip(contents["config"]), "data_files": contents["data_files"]})
    matches = []
    for meta in sorted(cache_dir.glob("*.json")):
        try:
            have = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(have, dict) or not isinstance(have.get("config"), dict):
            continue
        if _strip(have["config"]) == want["config"] and meta.with_suffix(".pt").exists():
            how = same_data_files(have.get("data_files"), want["data_files"])
            if how:
                matches.append((meta.with_suffix(".pt"), how))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no MAP cache entry in {cache_dir} for key {key} nor with the same training config and "
                          "data files: has this seed's MAP network finished training? (--map-cache-dir)")
    raise LookupError(f"{len(matches)} MAP cache entries in {cache_dir} have the job's training config and data files "
                      f"(trained by different code): {[m.name for m, _ in matches]}; point --map-cache-dir at a folder "
                      "with one of them")


def launch_cwd(sweep_dir: Path) -> Path:
    """The folder the sweep was launched from (last line of ``launches.jsonl``), else ``.``."""
    path = sweep_dir / "launches.jsonl"
    if path.exists():
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        if lines and "cwd" in json.loads(lines[-1]):
            return Path(json.loads(lines[-1])["cwd"])
    return Path(".")


def sweep_jobs(sweep_dir: Path) -> dict[int, dict[str, Path]]:
    """``{seed: {method_name: job folder}}`` of every job folder with a ``config_resolved.yaml``."""
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"--sweep-dir {sweep_dir} is not a folder")
    jobs: dict[int, dict[str, Path]] = {}
    for cfg_path in sorted(sweep_dir.glob("*/config_resolved.yaml")):
        cfg = OmegaConf.load(cfg_path)
        jobs.setdefault(int(cfg.seed), {})[str(cfg.method_name)] = cfg_path.parent
    if not jobs:
        raise FileNotFoundError(f"--sweep-dir {sweep_dir} has no job folders (*/config_resolved.yaml)")
    return jobs


def with_todays_root_options(cfg: DictConfig) -> tuple[DictConfig, list[str]]:
    """A copy of a job's resolved ``cfg`` with every scalar root option of today's schema
    (``config.schema.RootOptions``) that it lacks (added after the job's commit) at today's default;
    returns it and those names. Group keys are left alone (a group's defaults depend on the job's
    choice of group)."""
    from laplace_lab.config.schema import RootOptions
    from laplace_lab.io.fields import defaults

    today = defaults(RootOptions)
    missing = [k for k, v in today.items() if k not in cfg and not isinstance(v, dict)]
    filled = copy.deepcopy(cfg)
    for key in missing:
        filled[key] = today[key]
    return filled, missing


def load_job_map(job_dir: Path, cache_dir: Path | None, data_dir: str | None = None, edit=None):
    """Rebuild the job's data module and ``MAPModule`` and load its cached MAP network.
    ``edit(cfg)``, where given, changes the job's resolved config in place first (e.g. an ensemble
    member's seed). Returns ``(cfg, datamodule, module, entry, how)``."""
    from laplace_lab.config.load import load_run_config
    from laplace_lab.training.build import build

    cfg = OmegaConf.load(job_dir / "config_resolved.yaml")
    if data_dir is not None:
        cfg.paths.data_dir = cfg.data.data_dir = data_dir
    if edit is not None:
        edit(cfg)
    built, filled = with_todays_root_options(cfg)
    if filled:
        print(f"{job_dir.name}: root options newer than the job, at today's defaults for the rebuild: {filled}")
    datamodule, module = build(load_run_config(built))
    if cache_dir is None:
        cache_dir = Path(cfg.map_cache.dir)
        if not cache_dir.is_absolute():
            cache_dir = launch_cwd(job_dir.parent) / cache_dir
    job = load_run_config(cfg)  # raw: the job's own config, as its MAP cache key hashed it
    entry, how = find_entry(map_cache.key_contents(job, datamodule), map_cache.cache_key(job, datamodule), cache_dir)
    if not map_cache.load(module, entry):
        raise RuntimeError(f"MAP cache entry {entry} could not be loaded (see the warning above)")
    datamodule.setup("fit")
    return cfg, datamodule, module.eval(), entry, how


def check_map(row: dict, job_dirs: dict[str, Path]) -> None:
    """Our MAP metrics must equal those of every finished job of the seed (same network)."""
    for job in job_dirs.values():
        path = job / "metrics.json"
        if not path.exists():
            continue
        theirs = json.loads(path.read_text())
        bad = {k: (row[k], theirs[k]) for k in MAP_CHECK if k in theirs and abs(row[k] - theirs[k]) > MAP_CHECK_TOL}
        if bad:
            raise RuntimeError(f"MAP metrics differ from job {job} ({bad}, ours vs the job's): the MAP network "
                               "found is not the one that job evaluated")


# ---------------------------------------------------------------------------- CSV and summary
def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def append_row(path: Path, row: dict) -> None:
    peer_csv.append_row(path, row, FIELDS, extrasaction="ignore")  # rows carry more keys than FIELDS


SUMMARY_METRICS = ["test/la/acc", "test/la/nll", "test/la/ece", "test/la/brier", "ood/fashion_mnist/la/conf",
                   "ood/fashion_mnist/la/auroc", "ood/noise/la/conf", "ood/noise/la/auroc", "test/map/ece",
                   "ood/fashion_mnist/map/conf"]
REFERENCE_METRICS = ["test/la/nll", "test/la/ece", "test/la/brier", "ood/fashion_mnist/la/conf",
                     "ood/fashion_mnist/la/auroc", "ood/noise/la/conf"]


def ours_by_method(sweep_dir: Path | None) -> dict[str, dict[int, dict]]:
    """``{method_name: {seed: metrics.json}}`` of the sweep's finished jobs (empty without one)."""
    out: dict[str, dict[int, dict]] = {}
    for cfg_path in sorted(sweep_dir.glob("*/config_resolved.yaml")) if sweep_dir else []:
        metrics = cfg_path.parent / "metrics.json"
        if metrics.exists():
            cfg = OmegaConf.load(cfg_path)
            out.setdefault(str(cfg.method_name), {})[int(cfg.seed)] = json.loads(metrics.read_text())
    return out


def _fmt(stat: tuple[float, ...]) -> str:
    return f"{stat[0]:.4f} ± {stat[1]:.4f}" if stat[1] == stat[1] else f"{stat[0]:.4f}"


def summary(rows: list[dict], command: str, sweep_dir: Path | None = None) -> str:
    """Per method: mean ± s.e. over seeds of laplace-torch and of our finished jobs of the same
    seeds (``sweep_dir``); then
    reference.yaml entries (tolerance: 2 s.e. of laplace-torch over the seeds, stated)."""
    ours = ours_by_method(sweep_dir)
    lines, entries = [], []
    for method in METHODS:
        mrows = [r for r in rows if r["method_name"] == method]
        if not mrows:
            continue
        seeds = sorted(int(r["seed"]) for r in mrows)
        own_jobs = [m for seed, m in ours.get(method, {}).items() if seed in seeds]  # the same seeds only
        prior = mean_se([float(r["peer/prior_precision_mean"]) for r in mrows])
        lines += [f"\n{method} (seeds {seeds}; laplace-torch prior precision mean {_fmt(prior)})",
                  f"metric | laplace-torch (n={len(mrows)}) | ours, same seeds (n={len(own_jobs)})", "---|---|---"]
        for metric in SUMMARY_METRICS:
            peer = mean_se([float(r[metric]) for r in mrows])
            own = [m[metric] for m in own_jobs if metric in m]
            lines.append(f"{metric} | {_fmt(peer)} | {_fmt(mean_se(own)) if own else '-'}")
        for metric in REFERENCE_METRICS:
            mean, se, _ = mean_se([float(r[metric]) for r in mrows])
            if not math.isfinite(se):
                continue  # one seed: no stated tolerance; no entry
            name = metric.replace("/", "_").replace("_la_", "_")
            entries.append(
                f"  - id: peer_laplace_torch_{method}_{name}\n    kind: value\n    row: {{method_name: {method}}}\n"
                f"    metric: {metric}\n    value: {mean:.4f}\n"
                f"    tolerance: {2 * se:.4f}   # stated: 2 s.e. of laplace-torch over seeds {seeds}\n"
                f"    source: \"laplace-torch 0.3 on the same MAP networks, {command}\"")
    text = "\n".join(lines)
    if entries:
        text += "\n\nreference.yaml entries:\n" + "\n".join(entries)
    else:
        text += "\n\n(no reference.yaml entries: they need at least 2 seeds per method)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep-dir", type=Path, required=True,
                        help="the redux_mnist multirun folder (e.g. outputs/redux_mnist/multirun)")
    parser.add_argument("--map-cache-dir", type=Path, default=None,
                        help="default: each job's map_cache.dir (relative: to the sweep's launch folder)")
    parser.add_argument("--data-dir", default=None, help="override the jobs' data.data_dir")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {list(METHODS)}")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: every seed of the sweep)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prior-init", type=float, default=1.0, help="the authors' prior_precision: 1.")
    parser.add_argument("--n-steps", type=int, default=100, help="marglik Adam steps (laplace-torch's default)")
    parser.add_argument("--lr", type=float, default=0.1, help="marglik Adam lr (laplace-torch's default)")
    parser.add_argument("--summary", action="store_true", help="print per-method means and reference.yaml entries")
    args = parser.parse_args()
    methods = peer_csv.comma_choices(parser, "--methods", args.methods, METHODS)
    jobs = sweep_jobs(args.sweep_dir)
    seeds = sorted(jobs) if args.seeds is None else [int(s) for s in args.seeds.split(",")]
    missing = [s for s in seeds if s not in jobs]
    if missing:
        parser.error(f"--seeds: {missing} have no job in {args.sweep_dir}; there: {sorted(jobs)}")
    torch.set_num_threads(1)
    for message in ("By default `link_approx`", "Full backward hook is firing"):  # laplace-torch / BackPack notes
        warnings.filterwarnings("ignore", message=message)
    rows = read_rows(args.out)
    done = {(int(r["seed"]), r["method_name"]) for r in rows}
    for seed in seeds:
        todo = [m for m in methods if (seed, m) not in done]
        if not todo:
            continue
        job = jobs[seed].get("la") or next(iter(jobs[seed].values()))
        cfg, datamodule, module, entry, how = load_job_map(job, args.map_cache_dir, args.data_dir)
        eval_cfg = evaluation_config(cfg.evaluation)
        for method in todo:
            with tempfile.TemporaryDirectory() as tmp:
                row = peer_metrics(module, datamodule, method, eval_cfg, Path(tmp), args.prior_init, args.n_steps,
                                   args.lr)
            row.update({"seed": seed, "method_name": method, "job": job.name, "map_entry": entry.name,
                        "map_found_by": how})
            check_map(row, jobs[seed])
            append_row(args.out, row)
            rows.append({k: str(row[k]) for k in FIELDS})
            print(f"seed {seed} {method}: prior {row['peer/prior_precision_mean']:.4g}, test ECE {row['test/la/ece']:.4f} "
                  f"(MAP {row['test/map/ece']:.4f}), NLL {row['test/la/nll']:.4f} (MAP {row['test/map/nll']:.4f}), "
                  f"FMNIST conf {row['ood/fashion_mnist/la/conf']:.3f} (MAP {row['ood/fashion_mnist/map/conf']:.3f}), "
                  f"fit {row['peer/fit_s']:.0f} s, eval {row['peer/eval_s']:.0f} s", flush=True)
    if args.summary:
        print(summary(rows, COMMAND, args.sweep_dir))


if __name__ == "__main__":
    main()
