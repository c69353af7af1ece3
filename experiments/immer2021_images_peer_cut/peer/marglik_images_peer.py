"""End-to-end peer for the Immer et al. 2021 image tables: laplace-torch's ``marglik_training``
(the authors' Algorithm 1 as their library ships it; aleximmer/marglik ``marglik.py`` is the same
loop with an exponential lr decay by default) trains the network on our data at a CPU cut, and its
Laplace (KFAC-GGN, GLM probit; computed by our engine at the learned prior and checked against
laplace-torch's on the first test images, see ``evaluate``) and plug-in predictives are evaluated
with our metrics. One row per
data set, architecture and seed in the peer format of ``laplace_lab.reporting.peer_pairs``.

Same data and cut as our side (``laplace_lab.data.VisionDataModule``: the first ``--n-train``
images of a seeded permutation of the training set with 5000 held out, as ``data.n_train_subset``;
the 10000 test images), same recipe as ``immer2021_images_cpu`` at that cut: Adam 1e-3 with cosine
decay to 1e-6 stepped after every batch (laplace-torch steps its scheduler per batch), batch 128,
layerwise prior from 27.5, K=100 hyper steps at lr_hyp 1.0 every epoch from epoch 0 (F=1, B=0); the
best-marglik network and prior are returned (laplace-torch's rule, as ours). Temperature 1 (fixed,
as both codes' default). The cut both sides run (the defaults: 5000 images, 10 epochs) and our side
of it, preset ``immer2021_images_peer_cut``:

    PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_images_peer.py --data mnist,fashion_mnist \\
        --models lenet,mlp_500_300 --seeds 0,1,2
    python -m laplace_lab.train experiment=immer2021_images_peer_cut
    python -m laplace_lab.reporting.tables --preset immer2021_images_peer_cut <sweep folder> --results-dir <dir>
    PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_images_peer.py --add-ours <dir>/immer2021_images_peer_cut.jobs.csv

Metrics: ``test/la/{acc,nll,ece}``, ``test/map/{acc,nll,ece}`` (``laplace_lab.evaluation.metrics``),
``laplace/log_marglik`` (of the returned Laplace, as ours: the best-marglik weights and prior refit).
Resumes: rows already in ``--out`` are skipped.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from laplace_lab.data.vision import VisionDataModule
from laplace_lab.evaluation.metrics import classification_metrics
from laplace_lab.reporting.peer_csv import append_row, comma_choices, replace_ours_rows

MODELS = {"lenet": ("laplace_lab.models.lenet", "LeNet"), "mlp_500_300": ("laplace_lab.models.mlp", "MLP")}
METRICS = ["test/la/acc", "test/la/nll", "test/la/ece", "test/map/acc", "test/map/nll", "test/map/ece",
           "laplace/log_marglik"]
# theirs/trace_best_log_marglik: -min of marglik_training's trace (every hyper step of every epoch)
FIELDS = ["side", "seed", "commit", "command", "data", "model", "n_train", "epochs", "n_test", *METRICS,
          "theirs/trace_best_log_marglik", "check/our_engine_log_marglik", "check/la_max_abs_diff", "wall_s"]
ROOT = Path(__file__).resolve().parents[3]
# the authors' online-marglik settings as the immer2021_images_* presets hold them (a test checks
# that experiments/immer2021_images_peer_cut/preset.yaml has the same); the cut is --n-train / --epochs
RECIPE = {"batch_size": 128, "lr": 1e-3, "eta_min": 1e-6, "lr_hyp": 1.0, "n_hypersteps": 100, "marglik_frequency": 1,
          "n_epochs_burnin": 0, "prior_prec_init": 27.5, "n_val": 5000}
CUT = {"n_train": 5000, "epochs": 10}  # the defaults of --n-train / --epochs: immer2021_images_peer_cut's cut


def build_model(name: str, input_shape, num_outputs: int, overrides=None) -> torch.nn.Module:
    """``conf/model/<name>.yaml`` composed by Hydra (its defaults included), as ``training.build.build``
    does; ``overrides``: Hydra overrides that pick the model instead (e.g. ``("model=mlp", "model.widths=[50]")``)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    import laplace_lab.config  # noqa: F401 (registers the schema nodes the option files start from)

    conf_dir = str(ROOT / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        cfg = compose(config_name="train", overrides=list(overrides or [f"model={name}"]))
    return instantiate(cfg.model)(input_shape=input_shape, num_outputs=num_outputs)


def evaluate(la, model: torch.nn.Module, dm: VisionDataModule, n_test: int | None, check_images: int) -> dict:
    """Test metrics of the network ``marglik_training`` returned: its plug-in predictive, and the
    GLM probit predictive of the KFAC-GGN Laplace with the prior it learned (``la.prior_precision``),
    computed by our engine on the same training rows: laplace-torch's own GLM predictive forms the
    Jacobians ``[batch, C, P]`` and multiplies each by the Kronecker factors (MLP 500-300: 27 s per 64
    test images on one core here, 70 min per job). laplace-torch's predictive of the first
    ``check_images`` test images is compared with ours on every job (``check/la_max_abs_diff``: the
    largest difference of the two predictives' probabilities), and so is the log marglik."""
    from laplace_lab.laplace import Laplace as OurLaplace

    ours = OurLaplace(model, "classification", subset_of_weights="all", hessian_structure="kron",
                      prior_precision=la.prior_precision.detach().clone())
    ours.fit(dm.train_eval_dataloader(batch_size=256))
    probs_la, probs_map, peer_probs, ys = [], [], [], []
    with torch.no_grad():
        for x, y in dm.test_dataloader():
            probs_la.append(ours(x, pred_type="glm", link_approx="probit"))
            probs_map.append(torch.softmax(model(x), -1))
            ys.append(y)
            if n_test and sum(len(t) for t in ys) >= n_test:
                break
        checked = torch.cat(ys)[:check_images]  # laplace-torch: ~22 MB per image for MLP 500-300, chunks of 32
        peer_probs = torch.cat([la(x, pred_type="glm", link_approx="probit")
                                for x in next(iter(dm.test_dataloader()))[0][:len(checked)].split(32)])
    y = torch.cat(ys)[:n_test or None]
    probs_la, probs_map = torch.cat(probs_la)[:len(y)], torch.cat(probs_map)[:len(y)]
    row = {f"test/la/{k}": v for k, v in classification_metrics(probs_la, y).items() if k in ("acc", "nll", "ece")}
    row |= {f"test/map/{k}": v for k, v in classification_metrics(probs_map, y).items() if k in ("acc", "nll", "ece")}
    row["check/la_max_abs_diff"] = float((peer_probs - probs_la[:len(peer_probs)]).abs().max())
    row["check/our_engine_log_marglik"] = float(ours.log_marginal_likelihood())
    return row


def cut_data(data: str, seed: int, n_train: int, data_dir: str):
    """(data module, training loader) of the cut: the first ``n_train`` images of the seeded
    permutation with ``RECIPE['n_val']`` held out, batches of ``RECIPE['batch_size']``."""
    dm = VisionDataModule(name=data, data_dir=data_dir, n_train_subset=n_train,
                          batch_size=RECIPE["batch_size"], n_val=RECIPE["n_val"], seed=seed, download=False)
    dm.setup("fit")
    # a torch DataLoader reshuffled every epoch, as the authors' (dm.train_dataloader()'s sampler
    # reshuffles only when a Lightning loop calls set_epoch, which marglik_training does not)
    loader = torch.utils.data.DataLoader(dm.train_set, batch_size=RECIPE["batch_size"], shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    return dm, loader


def run_one(data: str, model_name: str, seed: int, args) -> dict:
    from laplace import marglik_training
    from laplace.curvature import AsdlGGN

    dm, loader = cut_data(data, seed, args.n_train, args.data_dir)
    torch.manual_seed(seed)
    model = build_model(model_name, dm.input_shape, 10)
    start = time.perf_counter()
    la, model, margliks, _ = marglik_training(
        model, loader, likelihood="classification", hessian_structure="kron", backend=AsdlGGN,
        optimizer_kwargs={"lr": RECIPE["lr"]}, scheduler_cls=torch.optim.lr_scheduler.CosineAnnealingLR,
        scheduler_kwargs={"T_max": args.epochs * len(loader), "eta_min": RECIPE["eta_min"]}, n_epochs=args.epochs,
        lr_hyp=RECIPE["lr_hyp"], prior_structure="layerwise", n_epochs_burnin=RECIPE["n_epochs_burnin"],
        n_hypersteps=RECIPE["n_hypersteps"], marglik_frequency=RECIPE["marglik_frequency"],
        prior_prec_init=RECIPE["prior_prec_init"], temperature=1.0)
    wall = time.perf_counter() - start
    model.eval()
    la.enable_backprop = False  # marglik_training returns it on (functorch Jacobians of the whole batch)
    row = evaluate(la, model, dm, args.n_test, args.check_images)
    # the returned Laplace (best-marglik weights and prior, refit on the training rows), as ours
    # logs laplace/log_marglik of its final Laplace at the best-marglik weights
    row["laplace/log_marglik"] = la.log_marginal_likelihood().item()
    row["theirs/trace_best_log_marglik"] = -min(margliks) if margliks else float("nan")
    row["wall_s"] = round(wall, 1)  # marglik_training only
    return row


def our_commit() -> str:
    """This checkout's commit (``+dirty`` when it has uncommitted changes), for the CSV's header."""
    import subprocess

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def start_csv(out: Path, peer_version: str, command: str) -> None:
    """A new peer CSV: ``#`` lines saying what made it, then the header."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        f.write(f"# immer2021 images peer: {peer_version} marglik_training (the authors' algorithm as their library\n"
                "# ships it) at a CPU cut, evaluated with our metrics; side 'ours' rows: our jobs of the same cut\n"
                "# (preset immer2021_images_peer_cut; their commit and command in the row, written by --add-ours).\n"
                f"# Started by: {command}\n"
                f"# at laplace-lab commit {our_commit()} (this script and the data module).\n")
        csv.DictWriter(f, FIELDS).writeheader()


def done_jobs(out: Path) -> set[tuple[str, ...]]:
    """(data, model, seed, n_train, epochs) of the ``theirs`` rows already in ``out`` (none when absent)."""
    if not out.exists():
        return set()
    with out.open() as f:
        return {(r["data"], r["model"], r["seed"], r["n_train"], r["epochs"])
                for r in csv.DictReader(line for line in f if not line.startswith("#")) if r["side"] == "theirs"}


def ours_peer_rows(jobs_csv: Path, n_train: int, epochs: int) -> list[dict]:
    """``side=ours`` rows of an ``immer2021_images_peer_cut`` jobs CSV (its online_kron jobs; seed =
    ``seed``); ``n_train`` / ``epochs``: the preset's cut, unless a job overrides
    ``data.n_train_subset`` / ``trainer.max_epochs``."""
    from laplace_lab.reporting.peer_ours import ours_rows

    rows = ours_rows(jobs_csv, seed_key="seed",
                     settings={"data": "data.name", "model": "model", "n_train": "data.n_train_subset",
                               "epochs": "trainer.max_epochs"},
                     metrics={**{m: m for m in METRICS}, "wall_s": "wall_s"}, where={"method_name": "online_kron"})
    for row in rows:
        row["n_train"] = row["n_train"] or n_train
        row["epochs"] = row["epochs"] or epochs
        row["n_test"] = 10000
    return rows


def add_ours(out: Path, jobs_csv: Path, n_train: int, epochs: int) -> None:
    """Replace the ``side=ours`` rows of ``out`` by the online_kron jobs of ``jobs_csv``."""
    rows = ours_peer_rows(jobs_csv, n_train, epochs)
    kept = replace_ours_rows(out, rows, FIELDS)
    print(f"{out}: {len(rows)} ours rows from {jobs_csv}, {kept} theirs rows kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="mnist")
    parser.add_argument("--models", default="lenet,mlp_500_300")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--n-train", type=int, default=CUT["n_train"])
    parser.add_argument("--epochs", type=int, default=CUT["epochs"])
    parser.add_argument("--n-test", type=int, default=None, help="first test images only (a smoke run); default all")
    parser.add_argument("--check-images", type=int, default=128,
                        help="first test images that laplace-torch's own GLM predictive also predicts (a check of ours)")
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR", "data"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("marglik_images.csv"))
    parser.add_argument("--add-ours", type=Path, metavar="JOBS_CSV",
                        help="instead of running: (re)write the side=ours rows of --out from this jobs CSV of "
                             "immer2021_images_peer_cut (the <name>.jobs.csv that laplace_lab.reporting.tables writes)")
    args = parser.parse_args()
    if args.add_ours:
        if not args.out.exists():
            parser.error(f"--add-ours: {args.out} does not exist (run the peer first)")
        add_ours(args.out, args.add_ours, args.n_train, args.epochs)
        return
    datasets = comma_choices(parser, "--data", args.data, ("mnist", "fashion_mnist"))
    models = comma_choices(parser, "--models", args.models, tuple(MODELS))
    torch.set_num_threads(1)
    from importlib.metadata import version

    peer_version = f"laplace-torch {version('laplace-torch')} (PyPI)"
    done = done_jobs(args.out)
    if not args.out.exists():
        start_csv(args.out, peer_version, "PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_images_peer.py "
                  + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    for data in datasets:
        for model_name in models:
            for seed in [int(s) for s in args.seeds.split(",")]:
                if (data, model_name, str(seed), str(args.n_train), str(args.epochs)) in done:
                    continue
                row = run_one(data, model_name, seed, args)
                row |= {"side": "theirs", "seed": seed, "commit": peer_version,
                        "command": f"PYTHONPATH=src python experiments/immer2021_images_peer_cut/peer/marglik_images_peer.py --data {data} "
                                   f"--models {model_name} --seeds {seed} --n-train {args.n_train} --epochs {args.epochs}"
                                   + (f" --n-test {args.n_test}" if args.n_test else ""),
                        "data": data, "model": model_name, "n_train": args.n_train, "epochs": args.epochs,
                        "n_test": args.n_test or 10000}
                append_row(args.out, row, FIELDS, counted=True)
                print(f"{data} {model_name} seed {seed}: LA nll {row['test/la/nll']:.4f}, plug-in nll "
                      f"{row['test/map/nll']:.4f}, log marglik {row['laplace/log_marglik']:.1f}, {row['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
