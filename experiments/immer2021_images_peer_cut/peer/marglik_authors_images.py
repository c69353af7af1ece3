"""The paper's own code for Immer et al. 2021 (aleximmer/marglik, ``marglik.py``) at the
``immer2021_images_peer_cut`` cut, on the four candidates of the architecture-selection study
(LeNet, MLP 500-300, MLP 50, MLP 100-100), one CSV row per data set, candidate and seed in the
peer format of ``laplace_lab.reporting.peer_pairs`` (sealed by ``laplace_lab.reporting.peer_csv``).

aleximmer/marglik holds Algorithm 1 as one function, ``marglik_optimization``; this script imports
it from a checkout (``--repo``, never copied here) and calls it unmodified. Data, networks and
metrics are those of the laplace-torch peer (``marglik_images_peer.py``, imported): the first 5000
images of the seeded permutation with 5000 held out (``laplace_lab.data.VisionDataModule``), a torch
DataLoader of batch 128 reshuffled every epoch, the network composed from ``conf/model`` by Hydra
and drawn under ``torch.manual_seed(seed)``. The call, the preset's recipe mapped onto the
function's arguments:

    marglik_optimization(model, loader, likelihood='classification', prior_structure='layerwise',
        prior_prec_init=27.5, n_epochs=10, lr=1e-3, lr_min=1e-6, scheduler='cos', lr_hyp=1.0)

Differs from the function's defaults: ``prior_prec_init`` (theirs 1; the preset's initial delta
27.5), ``n_epochs`` (500; the cut's 10), ``lr_min`` (None, i.e. no decay; the preset's eta_min 1e-6),
``scheduler`` ('exp'; 'cos' is CosineAnnealingLR over epochs x batches stepped after every batch,
which is the preset's ``cosine_per_step``), ``lr_hyp`` (0.1; the authors' image setting 1.0). At
the defaults and equal to the preset: Adam, ``n_hypersteps=100`` (K), ``marglik_frequency=1`` (F),
``n_epochs_burnin=0`` (B), ``laplace=KronLaplace``, ``backend=AsdlGGN``, ``temperature=1``, no
validation loader. The function keeps the weights and prior of the epoch whose last hyper step
had the best marglik and refits its Laplace there (the model and Laplace it returns).

Rows: ``laplace/log_marglik`` of the returned Laplace at its prior (as the laplace-torch peer),
its terms ``laplace/log_lik``, ``laplace/log_det_ratio``, ``laplace/scatter`` (laplace-torch's
properties; log marglik = log_lik - 0.5 (log_det_ratio + scatter)), the returned prior's mean
``hparams/prior_precision_mean``, and the plug-in ``test/map/{acc,nll,ece}`` of the returned
network on the 10000 test images (``laplace_lab.evaluation.metrics``). No Laplace predictive.

    PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py \\
        --repo <aleximmer/marglik checkout> --data fashion_mnist --seeds 0,1,2
    PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py --add-ours <jobs CSV>
    PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py --selection

Resumes: (data, model, seed) already in ``--out`` are skipped. One torch thread.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# candidate name (the CSV's `model`) -> our Hydra model overrides
CANDIDATES = {"lenet": ("model=lenet",), "mlp_500_300": ("model=mlp_500_300",),
              "mlp_50": ("model=mlp", "model.widths=[50]"), "mlp_100_100": ("model=mlp", "model.widths=[100,100]")}
TERMS = ["laplace/log_lik", "laplace/log_det_ratio", "laplace/scatter"]
METRICS = ["test/map/acc", "test/map/nll", "test/map/ece", "laplace/log_marglik", *TERMS, "hparams/prior_precision_mean"]
# peer column -> our jobs' metric (ours log the prior's mean as laplace/prior_precision_mean)
OURS_METRICS = {**{m: m for m in METRICS}, "hparams/prior_precision_mean": "laplace/prior_precision_mean"}
FIELDS = ["side", "seed", "commit", "command", "data", "model", "n_train", "epochs", *METRICS, "wall_s"]
DEFAULT_OUT = HERE / "marglik_authors_images.csv"


def laplace_torch_peer():
    """``marglik_images_peer.py`` beside this file (data, networks and recipe shared with it)."""
    spec = importlib.util.spec_from_file_location("marglik_images_peer", HERE / "marglik_images_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call_arguments(recipe: dict, epochs: int) -> dict:
    """The keyword arguments of ``marglik_optimization`` for the preset's ``recipe`` (the laplace-torch
    peer's ``RECIPE``) at ``epochs``; those left out stay at the function's defaults (module doc)."""
    defaults = {"n_hypersteps": 100, "marglik_frequency": 1, "n_epochs_burnin": 0}  # the function's
    differ = {k: recipe[k] for k in defaults if recipe[k] != defaults[k]}
    if differ:
        raise ValueError(f"recipe {differ} differs from marglik_optimization's defaults {defaults}: pass it explicitly")
    return {"likelihood": "classification", "prior_structure": "layerwise", "prior_prec_init": recipe["prior_prec_init"],
            "n_epochs": epochs, "lr": recipe["lr"], "lr_min": recipe["eta_min"], "scheduler": "cos",
            "lr_hyp": recipe["lr_hyp"]}


def command_of(data: str, model: str, seed: int, n_train: int, epochs: int) -> str:
    """The command a ``theirs`` row stands for (the CSV's ``command``)."""
    return ("PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py "
            f"--repo <aleximmer/marglik> --data {data} --models {model} --seeds {seed} --n-train {n_train} --epochs {epochs}")


def portable_argv(argv: list[str]) -> list[str]:
    """``argv`` with the paths of this machine (``--repo``, ``--data-dir``, ``--out``) as placeholders."""
    out, hide = [], {"--repo": "<aleximmer/marglik>", "--data-dir": "<data dir>", "--out": "<out>"}
    for i, arg in enumerate(argv):
        flag, sep, _ = arg.partition("=")
        if sep and flag in hide:
            out.append(f"{flag}={hide[flag]}")
        elif i and argv[i - 1] in hide:
            out.append(hide[argv[i - 1]])
        else:
            out.append(arg)
    return out


def laplace_row(la) -> dict:
    """Evidence cells of a fitted laplace-torch Laplace at its prior (classification: no sigma)."""
    return {"laplace/log_marglik": float(la.log_marginal_likelihood()), "laplace/log_lik": float(la.log_likelihood),
            "laplace/log_det_ratio": float(la.log_det_ratio), "laplace/scatter": float(la.scatter),
            "hparams/prior_precision_mean": float(la.prior_precision.mean())}


def plugin_metrics(model, test_loader) -> dict:
    """``test/map/{acc,nll,ece}`` of the network's softmax on every batch of ``test_loader``."""
    import torch

    from laplace_lab.evaluation.metrics import classification_metrics

    probs, ys = [], []
    with torch.no_grad():
        for x, y in test_loader:
            probs.append(torch.softmax(model(x), -1))
            ys.append(y)
    metrics = classification_metrics(torch.cat(probs), torch.cat(ys))
    return {f"test/map/{k}": metrics[k] for k in ("acc", "nll", "ece")}


def run_one(repo: Path, data: str, model_name: str, seed: int, n_train: int, epochs: int, data_dir: str) -> dict:
    """One job through ``marglik_optimization`` of the checkout at ``repo``; the CSV's metric cells."""
    import torch

    peer = laplace_torch_peer()
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from marglik import marglik_optimization  # the authors' function, unmodified

    dm, loader = peer.cut_data(data, seed, n_train, data_dir)
    torch.manual_seed(seed)
    model = peer.build_model(model_name, dm.input_shape, 10, overrides=CANDIDATES[model_name])
    start = time.perf_counter()
    la, model, _, _ = marglik_optimization(model, loader, **call_arguments(peer.RECIPE, epochs))
    wall = time.perf_counter() - start
    model.eval()
    return {**laplace_row(la), **plugin_metrics(model, dm.test_dataloader()), "wall_s": round(wall, 1)}


def candidate_of(model: str, widths: str) -> str:
    """Our job's (``model``, ``model.widths``) -> the candidate name of ``CANDIDATES``."""
    for name, overrides in CANDIDATES.items():
        keys = dict(o.split("=", 1) for o in overrides)
        if keys["model"] == model and keys.get("model.widths", "").replace(" ", "") in ("", widths.replace(" ", "")):
            if "model.widths" in keys or model != "mlp":
                return name
    raise ValueError(f"model={model!r} model.widths={widths!r} is none of the candidates {list(CANDIDATES)}")


def ours_peer_rows(jobs_csv: Path, n_train: int, epochs: int) -> list[dict]:
    """``side=ours`` rows of an ``immer2021_images_peer_cut`` jobs CSV: its online_kron jobs, the
    candidate named as in ``CANDIDATES``, the metrics this CSV has (those the jobs CSV lacks left empty)."""
    from laplace_lab.reporting.peer_ours import ours_rows, read_jobs

    columns = set(read_jobs(jobs_csv)[0])
    rows = ours_rows(jobs_csv, seed_key="seed",
                     settings={"data": "data.name", "model": "model", "widths": "model.widths",
                               "n_train": "data.n_train_subset", "epochs": "trainer.max_epochs"},
                     metrics={**{c: m for c, m in OURS_METRICS.items() if m in columns}, "wall_s": "wall_s"},
                     where={"method_name": "online_kron"})
    for row in rows:
        row["model"] = candidate_of(row["model"], row.pop("widths"))
        row["n_train"] = row["n_train"] or n_train
        row["epochs"] = row["epochs"] or epochs
    return rows


OURS_FROM = "# side 'ours' rows: "


def add_ours(out: Path, jobs_csv: Path, n_train: int, epochs: int, ours_from: str | None = None) -> None:
    """Replace the ``side=ours`` rows of ``out`` by the online_kron jobs of ``jobs_csv``; the header's
    ``# side 'ours' rows:`` line then says where they came from (``ours_from``, default the file's name)."""
    from laplace_lab.reporting.peer_csv import replace_ours_rows, seal

    rows = ours_peer_rows(jobs_csv, n_train, epochs)
    kept = replace_ours_rows(out, rows, FIELDS)
    text = ours_from or f"the online_kron jobs of {jobs_csv.name}"
    lines = [f"{OURS_FROM}{text} (their commit and command in the row, written by --add-ours).\n"
             if line.startswith(OURS_FROM) else line for line in out.read_text().splitlines(keepends=True)]
    out.write_text("".join(lines))
    seal(out)
    print(f"{out}: {len(rows)} ours rows from {jobs_csv}, {kept} theirs rows kept")


def selection(rows: list[dict], score: str = "laplace/log_marglik", target: str = "test/map/acc") -> list[dict]:
    """Per (data, side, seed) whose rows hold ``score`` and ``target`` for every candidate that side
    ran: the candidate with the highest ``score`` (``selected``), the one with the highest ``target``
    (``best``) and Kendall's tau of the two over the candidates (``laplace_lab.reporting.model_selection``)."""
    from laplace_lab.reporting.model_selection import kendall_tau

    groups: dict[tuple, dict[str, tuple[float, float]]] = {}
    for r in rows:
        if r.get(score, "") != "" and r.get(target, "") != "":
            groups.setdefault((r["data"], r["side"], int(r["seed"])), {})[r["model"]] = (float(r[score]), float(r[target]))
    out = []
    for (data, side, seed), cands in sorted(groups.items()):
        names = sorted(cands)
        out.append({"data": data, "side": side, "seed": seed, "candidates": names,
                    "selected": max(names, key=lambda m: cands[m][0]), "best": max(names, key=lambda m: cands[m][1]),
                    "tau": kendall_tau([cands[m][0] for m in names], [cands[m][1] for m in names])})
    return out


def print_selection(out: Path) -> None:
    """``selection`` of the rows of ``out``, one line per data set, side and seed."""
    from laplace_lab.reporting.peer_pairs import read_peer_csv

    for s in selection(list(read_peer_csv(out).rows)):
        print(f"{s['data']} {s['side']} seed {s['seed']}: selected {s['selected']}, most accurate {s['best']}, "
              f"tau {s['tau']:+.2f} over {len(s['candidates'])} candidates")


def start_csv(out: Path, command: str, our_commit: str, ours_from: str) -> None:
    """A new peer CSV: ``#`` lines saying what made it, then the header."""
    with out.open("w", newline="") as f:
        f.write("# immer2021 images peer: the paper's code, aleximmer/marglik marglik.py's marglik_optimization (called\n"
                "# unmodified; recipe mapped in the script's docstring) at the immer2021_images_peer_cut cut, the four\n"
                "# candidates of the architecture selection; plug-in test metrics by our metrics code.\n"
                f"# Started by: {command}\n"
                f"# at laplace-lab commit {our_commit} (this script, the data module and the networks).\n"
                f"{OURS_FROM}{ours_from} (their commit and command in the row, written by --add-ours).\n")
        csv.DictWriter(f, FIELDS).writeheader()


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from laplace_lab.reporting.peer_checkout import PeerCheckoutError, checkout_commit
    from laplace_lab.reporting.peer_csv import append_row, comma_choices

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="checkout of aleximmer/marglik (the folder holding marglik.py)")
    parser.add_argument("--data", default="fashion_mnist", help="comma-separated: mnist, fashion_mnist")
    parser.add_argument("--models", default=",".join(CANDIDATES), help=f"comma-separated: {', '.join(CANDIDATES)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--n-train", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR", "data"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--ours-from", default=None,
                        help="what the side=ours rows come from, for the CSV's header (a jobs CSV and how it was made)")
    parser.add_argument("--add-ours", type=Path, metavar="JOBS_CSV",
                        help="(re)write the side=ours rows of --out from this immer2021_images_peer_cut jobs CSV, then stop")
    parser.add_argument("--selection", action="store_true",
                        help="print the architecture each side's log marglik selects per seed in --out, then stop")
    args = parser.parse_args()
    if args.selection:
        print_selection(args.out)
        return
    if args.add_ours:
        if not args.out.exists():
            parser.error(f"--add-ours: {args.out} does not exist (run the peer first)")
        add_ours(args.out, args.add_ours, args.n_train, args.epochs, args.ours_from)
        return
    datasets = comma_choices(parser, "--data", args.data, ("mnist", "fashion_mnist"))
    models = comma_choices(parser, "--models", args.models, tuple(CANDIDATES))
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not comma-separated integers")
    try:
        commit = checkout_commit(args.repo, "aleximmer/marglik", "--repo", needs="marglik.py")
    except PeerCheckoutError as err:
        parser.error(str(err))
    import torch

    torch.set_num_threads(1)
    done = laplace_torch_peer().done_jobs(args.out)
    if not args.out.exists():
        start_csv(args.out, "PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py "
                  + " ".join(shlex.quote(a) for a in portable_argv(sys.argv[1:])),
                  laplace_torch_peer().our_commit(), args.ours_from or "none yet")
    for data in datasets:
        for model_name in models:
            for seed in seeds:
                if (data, model_name, str(seed), str(args.n_train), str(args.epochs)) in done:
                    continue
                row = run_one(args.repo, data, model_name, seed, args.n_train, args.epochs, args.data_dir)
                row |= {"side": "theirs", "seed": seed, "commit": commit, "data": data, "model": model_name,
                        "command": command_of(data, model_name, seed, args.n_train, args.epochs),
                        "n_train": args.n_train, "epochs": args.epochs}
                append_row(args.out, row, FIELDS, counted=True)
                print(f"{data} {model_name} seed {seed}: log marglik {row['laplace/log_marglik']:.1f}, plug-in acc "
                      f"{row['test/map/acc']:.4f}, nll {row['test/map/nll']:.4f}, {row['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
