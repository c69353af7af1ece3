"""Why does the marglik rank the architectures as it does? Its fit and Occam terms per finished job.

For each finished ``online_kron`` job folder (``checkpoint.enabled=true``, as in ``immer2021_images``),
the run's final Laplace is fitted again at the weights and prior online marglik kept
(``laplace_lab.training.job_laplace``) and its evidence is split as

    log marglik = log_lik - 0.5 * (log_det_ratio + scatter)

``log_lik`` is the training log likelihood (the fit), ``-0.5 (log_det_ratio + scatter)`` the Occam
term. Prints one markdown row per job with the job's test accuracy and Laplace NLL from its
``metrics.json`` (folders without one, unfinished jobs, are named and skipped). Jobs run at or
after the commit that records ``laplace/log_lik`` etc. in ``metrics.json`` need no refit: their
recorded terms are printed (``--refit`` forces one). ``--by-tensor`` also splits each job's log det
ratio by parameter tensor (``Laplace.log_det_ratio_by_tensor``): which layers carry the Occam term.

    PYTHONPATH=src python experiments/immer2021_uci/marglik_terms.py <job folder> [<job folder> ...] [--data-dir DIR] [--by-tensor]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

TERMS = ("laplace/log_marglik", "laplace/log_lik", "laplace/log_det_ratio", "laplace/scatter")
COLUMNS = ("data", "model", "seed", "params", "log marglik", "log lik", "log det ratio", "scatter", "Occam",
           "test acc", "test LA NLL", "terms")


def job_terms(job: Path, data_dir: str | None = None, refit: bool = False) -> dict:
    """One row: the job's identity, its evidence terms (recorded or refitted) and its test metrics."""
    cfg = OmegaConf.load(job / "config_resolved.yaml")
    metrics = json.loads((job / "metrics.json").read_text())
    recorded = all(k in metrics for k in TERMS)
    if refit or not recorded:
        from laplace_lab.training.job_laplace import final_laplace

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        *_, la, terms = final_laplace(job, data_dir)
        n_params = la.n_params
        with torch.no_grad():
            by_tensor = {name: (la.model.get_parameter(name).numel(), float(v))
                         for name, v in la.log_det_ratio_by_tensor().items()}
    else:
        terms, n_params, by_tensor = metrics, None, None
    data = cfg.data.get("name") or str(cfg.data.get("_target_", "?")).rsplit(".", 1)[-1]
    model = cfg.model.get("name") or str(cfg.model.get("_target_", "?")).rsplit(".", 1)[-1]
    if "widths" in cfg.model:
        model = f"{model} {list(cfg.model.widths)}"
    return {"data": data, "model": model, "seed": cfg.seed, "params": n_params,
            **{k.split("/")[1]: terms[k] for k in TERMS},
            "occam": -0.5 * (terms["laplace/log_det_ratio"] + terms["laplace/scatter"]),
            "test_acc": metrics.get("test/map/acc"), "test_la_nll": metrics.get("test/la/nll"),
            "source": "recorded" if recorded and not refit else "refit", "by_tensor": by_tensor}


def markdown(rows: list[dict]) -> str:
    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r["data"], r["seed"], -r["log_marglik"])):
        lines.append("| " + " | ".join([
            r["data"], r["model"], str(r["seed"]), cell(r["params"], "d"), cell(r["log_marglik"], ".1f"),
            cell(r["log_lik"], ".1f"), cell(r["log_det_ratio"], ".1f"), cell(r["scatter"], ".1f"),
            cell(r["occam"], ".1f"), cell(r["test_acc"], ".4f"), cell(r["test_la_nll"], ".4f"), r["source"]]) + " |")
    return "\n".join(lines)


def by_tensor_markdown(rows: list[dict]) -> str:
    """The refitted jobs' log det ratio per parameter tensor: which layers carry the Occam term."""
    lines = ["| data | model | seed | tensor | size | log det ratio | share of the job's |", "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["data"], r["seed"], -r["log_marglik"])):
        for name, (size, value) in (r["by_tensor"] or {}).items():
            lines.append(f"| {r['data']} | {r['model']} | {r['seed']} | {name} | {size} | {value:.1f} | "
                         f"{value / r['log_det_ratio']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", type=Path, nargs="+", help="folders of finished online_kron jobs")
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR"),
                        help="data folder (default: LAPLACE_LAB_DATA_DIR, else the job's paths.data_dir)")
    parser.add_argument("--refit", action="store_true", help="refit even where metrics.json records the terms")
    parser.add_argument("--by-tensor", action="store_true",
                        help="refit and also print the log det ratio per parameter tensor (kron / diag jobs)")
    args = parser.parse_args()
    finished = [job for job in args.jobs if (job / "metrics.json").is_file()]
    for job in sorted(set(args.jobs) - set(finished)):
        print(f"skipped {job}: not finished (no metrics.json)", file=sys.stderr)
    if not finished:
        raise SystemExit("no finished job among the folders given")
    rows = [job_terms(job, args.data_dir, args.refit or args.by_tensor) for job in finished]
    print(markdown(rows))
    if args.by_tensor:
        print("\n" + by_tensor_markdown(rows))


if __name__ == "__main__":
    main()
