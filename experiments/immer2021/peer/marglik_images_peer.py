"""End-to-end peer for the Immer et al. 2021 image tables: laplace-torch's ``marglik_training``
(the authors' Algorithm 1 as their library ships it; aleximmer/marglik ``marglik.py`` is the same
loop with an exponential lr decay by default) trains the network on our data at a CPU cut, and its
Laplace (KFAC-GGN, GLM probit) and plug-in predictives are evaluated with our metrics. One row per
data set, architecture and seed in the peer format of ``laplace_lab.reporting.peer_pairs``.

Same data and cut as our side (``laplace_lab.data.VisionDataModule``: the first ``--n-train``
images of a seeded permutation of the training set with 5000 held out, as ``data.n_train_subset``;
the 10000 test images), same recipe as ``immer2021_images_cpu`` at that cut: Adam 1e-3 with cosine
decay to 1e-6 stepped after every batch (laplace-torch steps its scheduler per batch), batch 128,
layerwise prior from 27.5, K=100 hyper steps at lr_hyp 1.0 every epoch from epoch 0 (F=1, B=0); the
best-marglik network and prior are returned (laplace-torch's rule, as ours). Temperature 1 (fixed,
as both codes' default). Our side at the same cut:

    python -m laplace_lab.train experiment=immer2021_images_cpu method=online_kron data=<mnist|fashion_mnist> \\
        model=<lenet|mlp_500_300> seed=<s> data.n_train_subset=<N> trainer.max_epochs=<E> lr_scheduler=cosine_per_step

    PYTHONPATH=src python experiments/immer2021/peer/marglik_images_peer.py --data mnist --models lenet \\
        --seeds 0,1 --n-train 5000 --epochs 10

Metrics: ``test/la/{acc,nll,ece}``, ``test/map/{acc,nll,ece}`` (``laplace_lab.evaluation.metrics``),
``laplace/log_marglik``. Resumes: rows already in ``--out`` are skipped.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import torch

from laplace_lab.data.vision import VisionDataModule
from laplace_lab.evaluation.metrics import classification_metrics
from laplace_lab.reporting.peer_csv import append_row, comma_choices

MODELS = {"lenet": ("laplace_lab.models.lenet", "LeNet"), "mlp_500_300": ("laplace_lab.models.mlp", "MLP")}
METRICS = ["test/la/acc", "test/la/nll", "test/la/ece", "test/map/acc", "test/map/nll", "test/map/ece",
           "laplace/log_marglik"]
FIELDS = ["side", "seed", "commit", "command", "data", "model", "n_train", "epochs", "n_test", *METRICS, "wall_s"]


def build_model(name: str, input_shape, num_outputs: int) -> torch.nn.Module:
    """``conf/model/<name>.yaml`` composed by Hydra (its defaults included), as ``train.build`` does."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    conf_dir = str(Path(__file__).resolve().parents[3] / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        cfg = compose(config_name="train", overrides=[f"model={name}"])
    return instantiate(cfg.model)(input_shape=input_shape, num_outputs=num_outputs)


def run_one(data: str, model_name: str, seed: int, args) -> dict:
    from laplace import marglik_training
    from laplace.curvature import AsdlGGN

    dm = VisionDataModule(name=data, data_dir=args.data_dir, n_train_subset=args.n_train, batch_size=128,
                          seed=seed, download=False)
    dm.setup("fit")
    torch.manual_seed(seed)
    model = build_model(model_name, dm.input_shape, 10)
    loader = dm.train_dataloader()
    start = time.perf_counter()
    la, model, margliks, _ = marglik_training(
        model, loader, likelihood="classification", hessian_structure="kron", backend=AsdlGGN,
        optimizer_kwargs={"lr": 1e-3}, scheduler_cls=torch.optim.lr_scheduler.CosineAnnealingLR,
        scheduler_kwargs={"T_max": args.epochs * len(loader), "eta_min": 1e-6}, n_epochs=args.epochs,
        lr_hyp=1.0, prior_structure="layerwise", n_epochs_burnin=0, n_hypersteps=100, marglik_frequency=1,
        prior_prec_init=27.5, temperature=1.0)
    wall = time.perf_counter() - start
    model.eval()
    la.enable_backprop = False  # marglik_training returns it on (functorch Jacobians of the whole batch)
    probs_la, probs_map, ys = [], [], []
    with torch.no_grad():
        for xb, yb in dm.test_dataloader():
            for x, y in zip(xb.split(32), yb.split(32)):  # laplace-torch: ~15 MB per input here
                probs_la.append(la(x, pred_type="glm", link_approx="probit"))
                probs_map.append(torch.softmax(model(x), -1))
                ys.append(y)
            if args.n_test and sum(len(t) for t in ys) >= args.n_test:
                break
    y = torch.cat(ys)[:args.n_test or None]
    probs_la, probs_map = torch.cat(probs_la)[:len(y)], torch.cat(probs_map)[:len(y)]
    row = {f"test/la/{k}": v for k, v in classification_metrics(probs_la, y).items() if k in ("acc", "nll", "ece")}
    row |= {f"test/map/{k}": v for k, v in classification_metrics(probs_map, y).items() if k in ("acc", "nll", "ece")}
    row["laplace/log_marglik"] = -min(margliks) if margliks else float("nan")
    row["wall_s"] = round(wall, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="mnist")
    parser.add_argument("--models", default="lenet,mlp_500_300")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--n-train", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--n-test", type=int, default=None, help="first test images only (a smoke run); default all")
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR", "data"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("marglik_images.csv"))
    args = parser.parse_args()
    datasets = comma_choices(parser, "--data", args.data, ("mnist", "fashion_mnist"))
    models = comma_choices(parser, "--models", args.models, tuple(MODELS))
    torch.set_num_threads(1)
    done = set()
    if args.out.exists():
        with args.out.open() as f:
            done = {(r["data"], r["model"], r["seed"], r["n_train"], r["epochs"])
                    for r in csv.DictReader(line for line in f if not line.startswith("#"))}
    from importlib.metadata import version

    peer_version = f"laplace-torch {version('laplace-torch')} (PyPI)"
    for data in datasets:
        for model_name in models:
            for seed in [int(s) for s in args.seeds.split(",")]:
                if (data, model_name, str(seed), str(args.n_train), str(args.epochs)) in done:
                    continue
                row = run_one(data, model_name, seed, args)
                row |= {"side": "theirs", "seed": seed, "commit": peer_version,
                        "command": f"PYTHONPATH=src python experiments/immer2021/peer/marglik_images_peer.py --data {data} "
                                   f"--models {model_name} --seeds {seed} --n-train {args.n_train} --epochs {args.epochs}"
                                   + (f" --n-test {args.n_test}" if args.n_test else ""),
                        "data": data, "model": model_name, "n_train": args.n_train, "epochs": args.epochs,
                        "n_test": args.n_test or 10000}
                append_row(args.out, row, FIELDS)
                print(f"{data} {model_name} seed {seed}: LA nll {row['test/la/nll']:.4f}, plug-in nll "
                      f"{row['test/map/nll']:.4f}, log marglik {row['laplace/log_marglik']:.1f}, {row['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
