"""The authors' code for Immer, van der Ouderaa et al. 2022 (tychovdo/lila,
``classification_image.py``) run on the shared MNIST files at a CPU cut, one CSV row per data
variant, mode and seed, in the peer format of ``laplace_lab.reporting.peer_pairs``.

Modes, as the authors' ``experimentscripts/mnist_mlp`` scripts: ``none`` = ``M_mlp_base_*``
(``--method avgfunc --n_samples_aug 1``, no augmentation learned) and ``learned`` =
``M_mlp_kfac_*`` (``--method avgfunc --n_samples_aug S --optimize_aug --approx ggn_kron``, here with ``--use_jvp``). Their
scripts have no fixed-augmentation run (``--init_aug`` sets all six ranges alike), so ``fixed`` is
not run. Data variants: ``mnist`` -> our ``data.transform=none``, ``mnist_r180`` -> ``rotated_full``,
``mnist_r90`` -> ``rotated_partial``, ``translated_mnist`` -> ``translated``.

What is changed to run here (no copy of the authors' code; a checkout given by ``--repo``):
- their README installs ``AlexImmer/Laplace@lila`` and ``kazukiosawa/asdfghjkl@dev-alex``; the
  ``lila`` branch is not in the public snapshot reachable here, so the same lab's later vendored
  copies in aleximmer/heteroscedastic-nn ``dependencies/laplace`` (which has
  ``laplace/curvature/augmented_asdl.py``, the module LILA imports) and ``dependencies/asdl`` are
  installed instead (``--deps``);
- ``--device cpu``; ``--data_root`` a folder of links made here: their data sets subclass
  torchvision's MNIST, which looks for ``<root>/<class name>/raw`` (``RotatedMNIST/raw``, ...), so
  each of their class names links to the shared ``MNIST/raw`` files (no download);
- ``--save`` into a per-run folder whose pickle this script reads;
- ``learned`` runs with ``--use_jvp`` (their ``marglik_opt_jvecprod``, the variant their README's
  MNIST MLP example uses): the default variant calls ``KronLaplace.fit_partial``, a method of the
  ``lila`` branch that the vendored fork does not have;
- the cut: ``--subset_size``, ``--n_epochs``, ``--n_epochs_burnin``, ``--n_samples_aug``, ``--batch_size``,
  ``--lr_aug`` / ``--lr_aug_min`` (the command
  line is in every row).

Metrics: ``test/map/acc`` (the last epoch's test accuracy of the augmentation-averaged network,
their ``valid_perfs[-1]``), ``marglik/best_log_marglik`` (minus their best ``marglik``: the log
marglik at the best epoch, as our ``OnlineMarglik``'s), ``augmentation/<name>`` (|eta| of their AffineLayer2d in the order
translate_x, translate_y, rotation, scale_x, scale_y, shear).

    python experiments/immer2022_invariance_cpu/peer/lila_peer.py --repo <lila checkout> \\
        --data-root $LAPLACE_LAB_DATA_DIR --subset 312 --epochs 100 --samples 8 --seeds 0,1

Resumes: rows already in ``--out`` are skipped. One torch thread. ``--add-ours <jobs CSV>`` instead
(re)writes the ``side=ours`` rows from our ``immer2022_invariance_cpu`` jobs CSV (modes none and
learned; ``fixed`` has no counterpart):

    PYTHONPATH=src python experiments/immer2022_invariance_cpu/peer/lila_peer.py --repo <lila checkout> \\
        --data-root $LAPLACE_LAB_DATA_DIR --add-ours results/immer2022_invariance_cpu.jobs.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

# the project's stdlib-only helpers, importable also in the authors' environment (no PYTHONPATH=src)
sys.path.append(str(Path(__file__).resolve().parents[3] / "src"))
from laplace_lab.reporting.peer_checkout import PeerCheckoutError, checkout_commit  # noqa: E402
from laplace_lab.reporting.peer_csv import append_row  # noqa: E402

VARIANTS = {"mnist": "none", "mnist_r180": "rotated_full", "mnist_r90": "rotated_partial",
            "translated_mnist": "translated"}
MODES = ("none", "learned")
AUG_NAMES = ("translate_x", "translate_y", "rotation", "scale_x", "scale_y", "shear")
COLUMNS = ["side", "seed", "commit", "command", "data.transform", "augmentation.mode", "subset", "epochs",
           "test/map/acc", "marglik/best_log_marglik", *[f"augmentation/{n}" for n in AUG_NAMES], "wall_s"]


def lila_command(dataset: str, mode: str, seed: int, args) -> list[str]:
    cmd = ["classification_image.py", "--method", "avgfunc", "--dataset", dataset, "--n_epochs", str(args.epochs),
           "--device", "cpu", "--subset_size", str(args.subset), "--save", "--approx", "ggn_kron",
           "--batch_size", str(args.batch_size or args.subset), "--seed", str(seed), "--data_root", str(args.data_root),
           "--n_epochs_burnin", str(args.burnin)]
    if mode == "learned":  # --use_jvp: see the module docstring (fit_partial)
        cmd += ["--n_samples_aug", str(args.samples), "--optimize_aug", "--use_jvp"]
        if args.lr_aug is not None:  # constant: their cosine decay from --lr_aug to --lr_aug_min
            cmd += ["--lr_aug", str(args.lr_aug), "--lr_aug_min", str(args.lr_aug)]
    else:
        cmd += ["--n_samples_aug", "1"]
    return cmd


LILA_MNIST_CLASSES = ("MNIST", "RotatedMNIST", "TranslatedMNIST", "ScaledMNIST")


def link_data_root(data_root: Path, runs_dir: Path) -> Path:
    """``<runs_dir>/data/<class>/raw`` -> ``<data_root>/MNIST/raw`` for each of LILA's MNIST classes."""
    raw = (data_root / "MNIST" / "raw").resolve()
    if not raw.is_dir():
        raise SystemExit(f"--data-root: {raw} does not exist (torchvision's MNIST/raw files are needed)")
    root = (runs_dir / "data").resolve()
    for name in LILA_MNIST_CLASSES:
        link = root / name / "raw"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(raw, target_is_directory=True)
    return root


def read_result(run_dir: Path) -> dict:
    (pkl,) = list(run_dir.glob("results/**/*.pkl"))
    with pkl.open("rb") as f:
        result = pickle.load(f)
    row = {"test/map/acc": float(result["valid_perfs"][-1])}
    if "marglik" in result:
        row["marglik/best_log_marglik"] = -float(result["marglik"])
    if "aug_optimum" in result:
        for name, value in zip(AUG_NAMES, result["aug_optimum"]):
            row[f"augmentation/{name}"] = abs(float(value))
    else:  # no augmentation learned: the ranges stay at their initial 0
        row.update({f"augmentation/{name}": 0.0 for name in AUG_NAMES})
    return row


def shown_argv(argv: list[str]) -> str:
    """The command line with the values of the machine paths (``--repo``, ``--data-root``,
    ``--runs-dir``, ``--out``) replaced by ``<...>``: no machine path goes into a committed file."""
    hidden = ("--repo", "--data-root", "--runs-dir", "--out")
    out, skip = [], False
    for token in argv:
        name, sep, _ = token.partition("=")
        if skip:
            out.append("<" + out[-1].lstrip("-") + ">")
            skip = False
        elif name in hidden and sep:
            out.append(f"{name}=<{name.lstrip('-')}>")
        else:
            out.append(token)
            skip = token in hidden
    return " ".join(out)


def ours_peer_rows(jobs_csv: Path, subset: int, epochs: int) -> list[dict]:
    """``side=ours`` rows of an ``immer2022_invariance_cpu`` jobs CSV: its ``none`` and ``learned``
    jobs (seed = ``seed``), the metrics of ``COLUMNS``; ``subset`` / ``epochs``: the preset's cut."""
    from laplace_lab.reporting.peer_ours import ours_rows

    metrics = {c: c for c in COLUMNS[COLUMNS.index("test/map/acc"):]}
    rows = []
    for mode in MODES:
        rows += ours_rows(jobs_csv, seed_key="seed", settings={"data.transform": "data.transform",
                                                               "augmentation.mode": "augmentation.mode"},
                          metrics=metrics, where={"augmentation.mode": mode})
    for row in rows:
        row["subset"], row["epochs"] = subset, epochs
    return rows


def add_ours(out: Path, jobs_csv: Path, subset: int, epochs: int) -> None:
    """Replace the ``side=ours`` rows of ``out`` by the none/learned jobs of ``jobs_csv``."""
    from laplace_lab.reporting.peer_csv import replace_ours_rows

    rows = ours_peer_rows(jobs_csv, subset, epochs)
    kept = replace_ours_rows(out, rows, COLUMNS, extrasaction="ignore")
    print(f"{out}: {len(rows)} ours rows from {jobs_csv}, {kept} theirs rows kept")


def done_runs(out: Path) -> set[tuple[str, ...]]:
    """Keys ``(data.transform, augmentation.mode, seed, subset, epochs)`` of the authors' runs already in
    ``out`` (``side == "theirs"`` only: our rows from ``--add-ours`` share the key columns)."""
    if not out.exists():
        return set()
    with out.open() as f:
        return {(rec["data.transform"], rec["augmentation.mode"], rec["seed"], rec["subset"], rec["epochs"])
                for rec in csv.DictReader(line for line in f if not line.startswith("#")) if rec["side"] == "theirs"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, type=Path, help="checkout of tychovdo/lila")
    parser.add_argument("--data-root", required=True, type=Path, help="folder with MNIST/raw")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--subset", type=int, default=312)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8, help="augmentation samples of the learned mode")
    parser.add_argument("--burnin", type=int, default=10, help="their --n_epochs_burnin (epochs without marglik steps)")
    parser.add_argument("--lr-aug", type=float, default=None,
                        help="constant rate of the augmentation parameters (their --lr_aug = --lr_aug_min; default theirs, 0.05)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the subset (full batch, as theirs)")
    parser.add_argument("--runs-dir", type=Path, default=Path("outputs/lila_peer"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("lila.csv"))
    parser.add_argument("--add-ours", type=Path, metavar="JOBS_CSV",
                        help="instead of running: (re)write the side=ours rows of --out from this jobs CSV")
    args = parser.parse_args()
    if args.add_ours:
        if not args.out.exists():
            parser.error(f"--add-ours: {args.out} does not exist (run the peer first)")
        add_ours(args.out, args.add_ours, args.subset, args.epochs)
        return
    if not 0 <= args.burnin < args.epochs:
        parser.error(f"--burnin must be in [0, --epochs) (the best marglik is taken after it); got --burnin "
                     f"{args.burnin} with --epochs {args.epochs}")
    for name, allowed, value in (("--variants", VARIANTS, args.variants), ("--modes", MODES, args.modes)):
        unknown = [v for v in value.split(",") if v not in allowed]
        if unknown:
            parser.error(f"{name}: {unknown} not supported; allowed: {list(allowed)}")
    try:
        commit = checkout_commit(args.repo, "tychovdo/lila", "--repo")
    except PeerCheckoutError as err:
        parser.error(str(err))
    done = done_runs(args.out)
    if not args.out.exists():
        with args.out.open("w", newline="") as f:
            ours = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            f.write("# tychovdo/lila classification_image.py (MLP 784-1000-10 tanh, KFAC-GGN marglik) run here by\n"
                    "# experiments/immer2022_invariance_cpu/peer/lila_peer.py at a CPU cut (subset, epochs in the rows)\n"
                    f"# their commit {commit[:7]}; deps: aleximmer/heteroscedastic-nn dependencies/laplace and\n"
                    "# dependencies/asdl (see this script's docstring), torch/torchvision of its venv\n"
                    f"# started by: lila_peer.py {shown_argv(sys.argv[1:])}\n"
                    f"# at laplace-lab commit {ours}; side=ours rows: --add-ours (their commit in the row)\n")
            csv.DictWriter(f, COLUMNS).writeheader()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(args.repo.resolve()))
    args.data_root = link_data_root(args.data_root, args.runs_dir)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for mode in args.modes.split(","):
            for dataset in args.variants.split(","):
                key = (VARIANTS[dataset], mode, str(seed), str(args.subset), str(args.epochs))
                if key in done:
                    continue
                run_dir = (args.runs_dir / f"{dataset}_{mode}_N{args.subset}_E{args.epochs}_seed{seed}").resolve()
                run_dir.mkdir(parents=True, exist_ok=True)
                cmd = lila_command(dataset, mode, seed, args)
                start = time.time()
                proc = subprocess.run([sys.executable, str(args.repo.resolve() / cmd[0]), *cmd[1:]], cwd=run_dir,
                                      env=env, capture_output=True, text=True)
                (run_dir / "log.txt").write_text(proc.stdout + proc.stderr)
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{dataset} {mode} seed {seed}: the authors' script failed (log: {run_dir}/log.txt)")
                row = read_result(run_dir)
                shown = [c if c != str(args.data_root) else "<links to MNIST/raw>" for c in cmd]  # no machine paths
                row.update({"side": "theirs", "seed": seed, "commit": commit, "command": "python " + " ".join(shown),
                            "data.transform": VARIANTS[dataset], "augmentation.mode": mode, "subset": args.subset,
                            "epochs": args.epochs, "wall_s": round(time.time() - start, 1)})
                append_row(args.out, {k: row.get(k, "") for k in COLUMNS}, COLUMNS, counted=True)
                print(f"{dataset} {mode} seed {seed}: acc {row['test/map/acc']:.4f}, {row['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
