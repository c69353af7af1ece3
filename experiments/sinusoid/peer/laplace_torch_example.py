"""The ``sinusoid`` preset beside laplace-torch's regression example, seed by seed, on the same
MAP network: writes the peer CSV ``laplace_torch.csv`` (``laplace_lab.reporting.peer_pairs``).

Per seed, ours: the preset's job run in-process (``experiment=sinusoid seed=<s>`` composed by
Hydra, then the steps of ``laplace_lab.train.run``: ``train_map``, ``fit_posthoc_laplace``,
``evaluate``). Theirs: laplace-torch 0.3, imported as a library, with the recipe of its docs'
regression example (aleximmer/Laplace ``examples/regression_example.md``) on a copy of that
same trained network and the same training rows: ``Laplace(model, 'regression',
subset_of_weights='all', hessian_structure='full')``, ``fit`` on one full batch, then Adam
(lr 0.1) on ``log_prior`` and ``log_sigma`` from 1 for the example's 1000 steps on
``-la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())``; the Laplace predictive is
``la(x)`` (glm) plus ``la.sigma_noise**2``. Both sides' test metrics are
``laplace_lab.evaluation.metrics.regression_metrics`` on the data module's test rows; the MAP
test LL is the plug-in network with the noise std it was trained with (1: the preset's), so it is
the same number on both sides when both hold the same network (a check, not a comparison).

From the repository root, with the package importable (``PYTHONPATH=src`` or installed)::

    python experiments/sinusoid/peer/laplace_torch_example.py --seeds 0-4

``--epochs`` / ``--hyper-steps`` shrink both sides (smoke runs; the CSV records them in the command).
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
OUT = HERE / "laplace_torch.csv"
PRESET = "sinusoid"
METRICS = ("laplace/sigma_noise", "laplace/prior_precision_mean", "laplace/log_marglik", "test/la/ll", "test/map/ll")
COLUMNS = ("side", "seed", "commit", "command", "method", *METRICS)
METHOD = "posthoc_full_ggn"  # the preset's method_name
EXAMPLE = "aleximmer/Laplace examples/regression_example.md (post-hoc marglik: Adam lr 0.1 on log prior, log sigma from 1)"


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,2"`` -> [0, 2]; a clear error on anything else."""
    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-"))
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds: {text!r} is not a range 'a-b' or a list 'a,b,c' of integer seeds") from None


def overrides(seed: int, epochs: int | None, hyper_steps: int | None) -> list[str]:
    """The Hydra overrides of our job: the preset and seed, plus the smoke sizes where given."""
    out = [f"experiment={PRESET}", f"seed={seed}"]
    if epochs is not None:
        out.append(f"trainer.max_epochs={epochs}")
    if hyper_steps is not None:
        out.append(f"marglik.n_steps={hyper_steps}")
    return out


def run_ours(seed: int, epochs: int | None, hyper_steps: int | None, output_dir: Path):
    """Our job in-process: returns (our metrics, the trained MAP module, its data module)."""
    from hydra import compose, initialize_config_dir

    from laplace_lab.config import CONF_DIR
    from laplace_lab.config.load import load_run_config
    from laplace_lab.evaluation import run_evaluation
    from laplace_lab.train import set_cpu_modes
    from laplace_lab.training import loop_choice
    from laplace_lab.training.eval_plan import evaluation_plan
    from laplace_lab.training.fit import train_map
    from laplace_lab.training.posthoc import fit_posthoc_laplace

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides(seed, epochs, hyper_steps)
                      + [f"paths.output_root={output_dir}"])
    job = load_run_config(cfg)
    set_cpu_modes(job)
    loop = loop_choice.choose_loop(job)
    datamodule, module, trainer, metrics = train_map(job, output_dir, [], loop)
    module.to("cpu")
    la, la_metrics = fit_posthoc_laplace(job, module, datamodule)
    metrics.update(la_metrics)
    metrics.update(run_evaluation(evaluation_plan(job, module, datamodule, la, output_dir), step=trainer.global_step))
    return metrics, module, datamodule


def run_theirs(model: torch.nn.Module, datamodule, map_sigma: float, hyper_steps: int) -> dict[str, float]:
    """laplace-torch's regression example on ``model`` (left untouched: a copy is fitted) and the
    data module's training rows; test metrics as ours (``regression_metrics``)."""
    from laplace import Laplace
    from torch.utils.data import DataLoader, TensorDataset

    from laplace_lab.evaluation.metrics import regression_metrics

    model = copy.deepcopy(model).eval()
    X, y = datamodule.train_set.tensors
    train_loader = DataLoader(TensorDataset(X, y), batch_size=len(X))  # the example: full batch
    la = Laplace(model, "regression", subset_of_weights="all", hessian_structure="full")
    la.fit(train_loader)
    log_prior, log_sigma = torch.ones(1, requires_grad=True), torch.ones(1, requires_grad=True)
    hyper_optimizer = torch.optim.Adam([log_prior, log_sigma], lr=1e-1)
    for _ in range(hyper_steps):
        hyper_optimizer.zero_grad()
        neg_marglik = -la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())
        neg_marglik.backward()
        hyper_optimizer.step()
    Xt, yt = datamodule.test_set.tensors
    with torch.no_grad():
        f_mu, f_var = la(Xt)  # glm predictive: [N, 1], [N, 1, 1]
        f_mu, f_var = f_mu.reshape(len(Xt), 1), f_var.reshape(len(Xt), 1)
        sigma = float(la.sigma_noise.detach())
        la_ll = regression_metrics(f_mu, f_var + sigma**2, yt)["ll"]
        f_map = model(Xt)
        map_ll = regression_metrics(f_map, torch.full_like(f_map, map_sigma**2), yt)["ll"]
        log_marglik = float(la.log_marginal_likelihood())
    return {"laplace/sigma_noise": sigma, "laplace/prior_precision_mean": float(la.prior_precision.detach().mean()),
            "laplace/log_marglik": log_marglik, "test/la/ll": la_ll, "test/map/ll": map_ll}


def our_commit() -> str:
    """HEAD of this checkout, with ``-dirty`` when it has changes (then the CSV is not citable)."""
    from laplace_lab.sweeps.status import git_state

    state = git_state(ROOT)
    if not state["commit"]:
        return "unknown (not a git checkout)"
    return state["commit"] + ("-dirty" if state["dirty"] is not False else "")


def laplace_torch_version() -> str:
    from importlib.metadata import version

    return f"laplace-torch=={version('laplace-torch')} (PyPI)"


def pair_rows(seed: int, ours: dict, theirs: dict, commit: str, command: str, job: str) -> list[dict]:
    """The CSV's two rows of one seed (``COLUMNS``); ``job``: our job's overrides."""
    base = {"seed": seed, "method": METHOD}
    return [{**base, "side": "ours", "commit": commit, **{k: ours[k] for k in METRICS},
             "command": f"{command} (ours in-process: python -m laplace_lab.train {job})"},
            {**base, "side": "theirs", "commit": laplace_torch_version(), **{k: theirs[k] for k in METRICS},
             "command": f"{command} (theirs: the example's recipe on the network of {job})"}]


def write_csv(path: Path, rows: list[dict], header: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.writelines(f"# {line}\n" for line in header)
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["side"], int(r["seed"]))))
    from laplace_lab.reporting.peer_csv import seal

    seal(path)  # the row count last: a cut-off file is refused


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-4", help="'0-4' or '0,2' (default: the preset's 0-4)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--epochs", type=int, default=None, help="MAP epochs (default: the preset's 1000)")
    parser.add_argument("--hyper-steps", type=int, default=None,
                        help="marglik Adam steps on both sides (default: the preset's and the example's 1000)")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as err:
        parser.error(str(err))
    for flag, value in (("--epochs", args.epochs), ("--hyper-steps", args.hyper_steps)):
        if value is not None and value < 1:
            parser.error(f"{flag}: {value} must be a positive integer")
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_SILENT", "true")
    script = Path(__file__).resolve().relative_to(ROOT) if Path(__file__).resolve().is_relative_to(ROOT) else __file__
    command = f"python {script} " + " ".join(sys.argv[1:] if argv is None else argv)
    commit = our_commit()
    rows = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"sinusoid_peer_{seed}_") as tmp:
            ours, module, datamodule = run_ours(seed, args.epochs, args.hyper_steps, Path(tmp))
        theirs = run_theirs(module.model, datamodule, float(module.sigma_noise),
                            args.hyper_steps if args.hyper_steps is not None else 1000)
        rows += pair_rows(seed, ours, theirs, commit, command.strip(),
                          " ".join(overrides(seed, args.epochs, args.hyper_steps)))
        print(f"seed {seed}: " + ", ".join(f"{k} ours {ours[k]:.4f} theirs {theirs[k]:.4f}" for k in METRICS), flush=True)
    header = [f"sinusoid preset (ours) vs laplace-torch's regression example recipe (theirs, {laplace_torch_version()}, "
              "imported as a library) on the same trained MAP network and data per seed",
              f"theirs: {EXAMPLE}; test metrics of both sides by laplace_lab.evaluation.metrics.regression_metrics",
              f"made by: {command.strip()}"]
    write_csv(args.out, rows, header)
    print(args.out)


if __name__ == "__main__":
    main()
