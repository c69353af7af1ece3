"""The authors' code for Immer et al. 2023 (aleximmer/heteroscedastic-nn) run on the standard UCI
splits, one CSV row per data set, split and method, in the peer format of ``laplace_lab.reporting.peer_pairs``.

It runs ``run_uci_crispr_regression.main`` of a checkout of the authors' public repository (never
copied here) with their UCI config (``configs/uci.yaml``: float64, MLP 1x50 GELU, Adam 1e-2 -> 1e-5
cosine, 5000 epochs, batch 256, full GGN, layerwise prior, F=50, B=100, K=50, lr_hyp 1e-2 -> 1e-3,
marglik early stopping on) and their argument handling (``method=map`` sets the burn-in past the
last epoch, so MAP trains without hyper steps). Two run-time patches, nothing else changed:

1. ``wandb`` is replaced by a recorder (no account, no network): ``wandb.run.summary`` is the dict
   this script reads the test metrics from (``test/loglik``, ``test/loglik_bayes``, ...).
2. The split: the authors draw a random 90/10 train/test split per seed
   (``train_test_split(random_state=seed)`` in ``hetreg/uci_datasets.py``); here the train and test
   rows are those of standard split k (``index_train_k.txt`` / ``index_test_k.txt``, the rows our
   ``data=uci data.split=k`` reads), so both sides see the same test rows. Inside the training rows
   the authors' own 10 % validation draw (``train_test_split(random_state=seed)``) and their
   standardisation (training rows after the validation split) are kept; seed = k.

Metrics (original target units, the authors' evaluation code): ``test/la/ll`` is the Laplace
predictive's test log likelihood (``test/loglik_bayes``; heteroscedastic: ``het_approx='natural'``),
``test/map/ll`` the plug-in one (``test/loglik``; homoscedastic MAP: sigma = training RMSE),
``test/map/rmse`` the predictive mean's RMSE; heteroscedastic rows also give the authors'
``het_approx='mean'`` form as ``test/la_het_mean/ll`` (our ``la_het_mean`` predictor) and their MC
predictives under ``theirs/...``. ``--add-ours <jobs CSV>`` (re)writes the ``side=ours`` rows
from a committed jobs CSV of ``heteroscedastic_uci`` (``laplace_lab.reporting.peer_ours``), for the
splits of ``--splits`` only (default 0-2, the splits the authors' code runs here).

    python experiments/heteroscedastic_uci/peer/heteroscedastic_nn_peer.py --repo <checkout> \\
        --data-dir $LAPLACE_LAB_DATA_DIR/UCI --sets yacht --splits 0-2 --methods het_online

Resumes: rows already in ``--out`` are skipped. One torch thread.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

# the project's stdlib-only helpers, importable also in the authors' environment (no PYTHONPATH=src)
sys.path.append(str(Path(__file__).resolve().parents[3] / "src"))
from laplace_lab.reporting.peer_checkout import PeerCheckoutError, checkout_commit  # noqa: E402
from laplace_lab.reporting.peer_csv import append_row  # noqa: E402

# our method names -> the authors' command-line options (commands/jobs_uci_generate.py)
METHODS = {
    "het_online": {"likelihood": "heteroscedastic", "method": "marglik", "head": "natural"},
    "online_full": {"likelihood": "homoscedastic", "method": "marglik", "head": "natural"},
    "map_grid": {"likelihood": "homoscedastic", "method": "map", "head": "natural"},
    "het_map_grid": {"likelihood": "heteroscedastic", "method": "map", "head": "natural"},
}
SETS = ("boston-housing", "concrete", "energy", "kin8nm", "naval-propulsion-plant", "power-plant",
        "wine-quality-red", "yacht")
SUMMARY_TO_METRIC = {
    "test/loglik_bayes": "test/la/ll",
    "test/loglik": "test/map/ll",
    "test/loglik_bayes_mean": "test/la_het_mean/ll",
    "test/loglik_bayes_mc": "theirs/la_mc/ll",
    "test/loglik_bayes_mc_lse": "theirs/la_mc_lse/ll",
    "prior_prec_opt": "theirs/map_grid_prior_precision",
}
COLUMNS = ["side", "seed", "commit", "command", "data", "method", "test/la/ll", "test/map/ll", "test/map/rmse",
           "test/la_het_mean/ll", "theirs/la_mc/ll", "theirs/la_mc_lse/ll", "theirs/map_grid_prior_precision",
           "wall_s"]


def parse_range(text: str) -> list[int]:
    """'0-2' or '0,3,5' -> the split indices."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def wandb_recorder() -> types.ModuleType:
    """A stand-in for the ``wandb`` module: ``run.summary`` is a dict, everything else a no-op."""
    module = types.ModuleType("wandb")
    module.run = types.SimpleNamespace(summary={})
    module.config = types.SimpleNamespace(update=lambda *a, **k: None)
    module.log = lambda *a, **k: None
    module.init = lambda *a, **k: module.run
    module.Histogram = lambda *a, **k: None
    return module


def patch_standard_split(uci_module, data_dir: Path, split: int) -> type:
    """Make the authors' ``UCIRegressionDatasets`` take the train/test rows of standard split
    ``split``: their ``train_test_split(xy_full, train_size=0.9, random_state=seed)`` call (the
    first one of each dataset object) returns the standard split's rows instead; the second call
    (validation out of the training rows) is theirs, unchanged."""
    import numpy as np

    original = uci_module.modsel.train_test_split

    def first_call_standard(arrays, *args, **kwargs):
        n_rows = arrays.shape[0]
        if n_rows == state["n_full"]:
            return arrays[state["train"]].copy(), arrays[state["test"]].copy()
        return original(arrays, *args, **kwargs)

    def load(name):
        root = data_dir / name
        full = np.loadtxt(root / "data.txt")
        train = np.loadtxt(root / f"index_train_{split}.txt", dtype=int)
        test = np.loadtxt(root / f"index_test_{split}.txt", dtype=int)
        return full, train, test

    state: dict = {}

    class StandardSplitUCI(uci_module.UCIRegressionDatasets):
        def __init__(self, data_set, *args, **kwargs):
            full, state["train"], state["test"] = load(data_set)
            state["n_full"] = len(full)
            super().__init__(data_set, *args, **kwargs)

    uci_module.modsel.train_test_split = first_call_standard
    return StandardSplitUCI


def git_commit(path: Path) -> str:
    return checkout_commit(path, "aleximmer/heteroscedastic-nn", "--repo")


def run_one(repo: Path, data_dir: Path, data: str, split: int, method: str) -> dict:
    """One run of the authors' script's ``main``; returns the CSV metrics."""
    import torch
    torch.set_num_threads(1)
    recorder = wandb_recorder()
    sys.modules["wandb"] = recorder
    sys.path.insert(0, str(repo))
    import run_uci_crispr_regression as script  # noqa: E402  (the authors' script)
    from hetreg import uci_datasets

    script.UCIRegressionDatasets = patch_standard_split(uci_datasets, data_dir, split)
    config = yaml_config(repo / "configs" / "uci.yaml")
    opts = METHODS[method]
    args = dict(config, seed=split, dataset=data, method=opts["method"], likelihood=opts["likelihood"],
                head=opts["head"], beta=0.5, device="cpu", data_root=str(data_dir), use_wandb=True,
                marglik_early_stopping=True, vi_prior_mu=0.0, vi_posterior_mu_init=0.0,
                vi_posterior_rho_init=-3.0, typeofrep="Flipout", rep=0)
    if opts["method"] == "map":  # the script's own rule: no marglik optimisation for MAP
        args["n_epochs_burnin"] = args["n_epochs"] + 1
    start = time.time()
    script.main(**args)
    summary = recorder.run.summary
    scale = float(last_scale["s"]) if last_scale else float("nan")
    row = {metric: float(summary[key]) for key, metric in SUMMARY_TO_METRIC.items() if key in summary}
    row["test/map/rmse"] = math.sqrt(float(summary["test/mse"])) * scale
    row["wall_s"] = round(time.time() - start, 1)
    return row


last_scale: dict = {}


def yaml_config(path: Path) -> dict:
    """The config as the script's argparse sees it: YAML reads ``1e-2`` as text, argparse's
    ``type=float`` turns such a default into a number."""
    import yaml

    def number(value):
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value

    return {key: number(value) for key, value in yaml.safe_load(path.read_text()).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="checkout of aleximmer/heteroscedastic-nn")
    parser.add_argument("--data-dir", type=Path, help="folder with the UCI sets (standard splits)")
    parser.add_argument("--sets", default="boston-housing,concrete,energy,wine-quality-red,yacht")
    parser.add_argument("--splits", default="0-2")
    parser.add_argument("--methods", default="het_online,online_full,map_grid")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("heteroscedastic_nn.csv"))
    parser.add_argument("--add-ours", type=Path, nargs="+",
                        help="heteroscedastic_uci jobs CSV(s): write their rows of --splits as side=ours (a later "
                             "file's job replaces an earlier file's of the same set, method and split)")
    parser.add_argument("--import-rows", type=Path,
                        help="a folder of '--one' logs named <set>_<split>_<method>.log (runs made elsewhere, e.g. "
                             "in parallel): append their rows as side=theirs (needs --repo for the commit)")
    parser.add_argument("--one", nargs=3, metavar=("DATA", "SPLIT", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.add_ours and (args.repo is None or (args.data_dir is None and not args.import_rows)):
        parser.error("--repo (a checkout of aleximmer/heteroscedastic-nn) and --data-dir are required to run "
                     "the authors' code")
    if not args.add_ours:
        try:
            git_commit(args.repo)  # a missing checkout: where to clone it from, before any work
        except PeerCheckoutError as err:
            parser.error(str(err))
    for name in args.sets.split(","):
        if name not in SETS:
            parser.error(f"--sets: {name!r} is not one of {list(SETS)}")
    for method in args.methods.split(","):
        if method not in METHODS:
            parser.error(f"--methods: {method!r} is not one of {list(METHODS)}")

    if args.one:  # child process: one run, its metrics as one CSV line on stdout's last line
        data, split, method = args.one[0], int(args.one[1]), args.one[2]
        from hetreg import uci_datasets as _  # noqa: F401
        _record_scale(args.repo)
        row = run_one(args.repo, args.data_dir, data, split, method)
        print("ROW " + json.dumps(row))
        return

    if args.add_ours:
        add_ours(args.out, args.add_ours, parse_range(args.splits))
        return
    theirs_commit = git_commit(args.repo)
    if args.import_rows:
        import_rows(args.out, args.import_rows, theirs_commit)
        return
    done = set()
    if args.out.exists():
        with args.out.open() as f:
            for rec in csv.DictReader(line for line in f if not line.startswith("#")):
                done.add((rec["side"], rec["data"], rec["seed"], rec["method"]))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(args.repo))
    ensure_header(args.out)
    for method in args.methods.split(","):  # a cut-off run has whole (method, set) cells done
        for data in args.sets.split(","):
            for split in parse_range(args.splits):
                if ("theirs", data, str(split), method) in done:
                    continue
                command = authors_command(data, split, method)
                proc = subprocess.run([sys.executable, __file__, "--repo", str(args.repo), "--data-dir",
                                       str(args.data_dir), "--one", data, str(split), method],
                                      capture_output=True, text=True, env=env)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("ROW ")]
                if proc.returncode != 0 or not lines:
                    print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                    raise SystemExit(f"{data} split {split} {method}: the authors' script failed")
                row = json.loads(lines[-1][4:])
                row.update(side="theirs", seed=split, commit=theirs_commit, command=command, data=data, method=method)
                append_row(args.out, {k: row.get(k, "") for k in COLUMNS}, COLUMNS, counted=True)
                print(f"{data} split {split} {method}: LA ll {row.get('test/la/ll')}, "
                      f"plug-in ll {row.get('test/map/ll')}, {row['wall_s']} s", flush=True)


def authors_command(data: str, split: int, method: str) -> str:
    """The authors' command line this script's patched run stands for (the CSV's ``command``)."""
    opts = METHODS[method]
    return (f"python run_uci_crispr_regression.py --seed {split} --dataset {data} --config configs/uci.yaml"
            f" --likelihood {opts['likelihood']} --method {opts['method']}"
            + (f" --head {opts['head']}" if opts["likelihood"] == "heteroscedastic" else "")
            + f" (standard split {split}; peer script's patches)")


def ensure_header(out: Path) -> None:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="") as f:
            f.write("# aleximmer/heteroscedastic-nn run on the standard UCI splits (seed = split) by\n"
                    "# experiments/heteroscedastic_uci/peer/heteroscedastic_nn_peer.py; side 'ours' rows are\n"
                    "# our jobs of the same split (their commit and command in the row)\n")
            csv.DictWriter(f, COLUMNS).writeheader()


def import_rows(out: Path, folder: Path, commit: str) -> None:
    """Append the ``ROW`` lines of ``folder/<set>_<split>_<method>.log`` ('--one' runs made elsewhere)
    as side=theirs rows, skipping (set, split, method) already in ``out``."""
    ensure_header(out)
    with out.open() as f:
        done = {(r["data"], r["seed"], r["method"]) for r in csv.DictReader(line for line in f if not line.startswith("#"))
                if r["side"] == "theirs"}
    added = 0
    for log in sorted(folder.glob("*.log")):
        method = next((m for m in METHODS if log.stem.endswith("_" + m)), None)  # method names hold '_'
        if method is None:
            continue
        data, split = log.stem[: -len(method) - 1].rsplit("_", 1)
        rows = [line for line in log.read_text().splitlines() if line.startswith("ROW ")]
        if not rows or (data, split, method) in done or data not in SETS:
            continue
        row = json.loads(rows[-1][4:])
        row.update(side="theirs", seed=int(split), commit=commit, command=authors_command(data, int(split), method),
                   data=data, method=method)
        append_row(out, {k: row.get(k, "") for k in COLUMNS}, COLUMNS, counted=True)
        added += 1
    print(f"{out}: {added} rows imported from {folder}")


def add_ours(out: Path, jobs_csvs: list[Path], splits: list[int] | None = None) -> None:
    """Replace the ``side=ours`` rows of ``out`` by the jobs of ``jobs_csvs`` (seed = split; a later
    file's job replaces an earlier one's of the same set, method and split); ``splits``: only the jobs of
    these splits (the ones the authors' code runs; our table may hold more), all when None. A job that logged
    ``test/la_het_mean/ll`` has both closed forms; an older one (before ``predictive.het_approx``)
    logged the 'mean' form as ``test/la/ll``, which goes to ``test/la_het_mean/ll`` here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
    from laplace_lab.reporting.peer_csv import replace_ours_rows
    from laplace_lab.reporting.peer_ours import ours_rows, read_jobs

    by_key: dict = {}
    for jobs_csv in jobs_csvs:
        natural = "test/la_het_mean/ll" in set(read_jobs(jobs_csv)[0])
        for method in ("het_online", "online_full", "map_grid"):
            metrics = {"test/map/ll": "test/map/ll", "test/map/rmse": "test/map/rmse"}
            if method == "het_online":
                metrics.update({"test/la/ll": "test/la/ll", "test/la_het_mean/ll": "test/la_het_mean/ll"} if natural
                               else {"test/la_het_mean/ll": "test/la/ll"})
            elif method == "online_full":
                metrics["test/la/ll"] = "test/la/ll"
            for row in ours_rows(jobs_csv, seed_key="data.split", settings={"data": "data.name", "method": "method_name"},
                                 metrics=metrics, where={"method_name": method}):
                if splits is None or int(row["seed"]) in splits:
                    by_key[(row["data"], row["method"], row["seed"])] = row
    rows = list(by_key.values())
    kept = replace_ours_rows(out, rows, COLUMNS, extrasaction="ignore")
    print(f"{out}: {len(rows)} ours rows from {[str(p) for p in jobs_csvs]}, {kept} theirs rows kept")


def _record_scale(repo: Path) -> None:
    """Keep the training targets' std of the authors' ``ds_train`` (their ``scale``), to put the
    RMSE in original units as their log likelihoods are."""
    sys.path.insert(0, str(repo))
    from hetreg import uci_datasets

    init = uci_datasets.UCIRegressionDatasets.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.split == "train" and self.has_valid_set:
            last_scale["s"] = self.s

    uci_datasets.UCIRegressionDatasets.__init__ = recording_init


if __name__ == "__main__":
    main()
