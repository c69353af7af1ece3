"""The peer side of ``benchmarks/e2e_small.py``: laplace-torch's ``marglik_training`` as a library.

Reads one data split exported by ``e2e_small.py`` (a ``torch.save`` dict with standardised
``x_train [N, D]``, ``y_train [N, 1]``, ``x_test``, ``y_test`` and the float ``target_std``), trains
an MLP (one hidden layer of 50 tanh units) with Immer et al.'s recipe through
``laplace.marglik_training`` (Adam 1e-2, one full batch, full GGN, layerwise prior, noise std by
marglik) and prints one JSON line: the test log likelihood of the GLM predictive in original
units (mean over points) and the final noise std.

    python benchmarks/e2e_peer.py SPLIT.pt [--epochs 1000] [--frequency 50] [--burnin 100]
        [--n-steps 50] [--backend curvlinops] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from laplace import marglik_training
from laplace.curvature import BackPackGGN, CurvlinopsGGN
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BACKENDS = {"curvlinops": CurvlinopsGGN, "backpack": BackPackGGN}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("split", help="the .pt file written by e2e_small.py")
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--frequency", type=int, default=50)
    parser.add_argument("--burnin", type=int, default=100)
    parser.add_argument("--n-steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="curvlinops")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    data = torch.load(args.split, weights_only=True)
    torch.manual_seed(args.seed)
    x, y = data["x_train"], data["y_train"]
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x), shuffle=True)
    model = nn.Sequential(nn.Linear(x.shape[1], 50), nn.Tanh(), nn.Linear(50, y.shape[1]))
    la, model, _, _ = marglik_training(
        model, loader, likelihood="regression", hessian_structure="full", backend=BACKENDS[args.backend],
        optimizer_kwargs={"lr": args.lr}, n_epochs=args.epochs, lr_hyp=0.1, prior_structure="layerwise",
        n_epochs_burnin=args.burnin, n_hypersteps=args.n_steps, marglik_frequency=args.frequency,
    )
    with torch.no_grad():
        f_mu, f_var = la(data["x_test"], pred_type="glm")
        var = f_var.reshape(len(f_mu), -1) + la.sigma_noise.square()
        mean, yt = f_mu.reshape(len(f_mu), -1), data["y_test"].reshape(len(f_mu), -1)
        ll = -0.5 * (math.log(2 * math.pi) + var.log() + (yt - mean).square() / var)
        ll = ll.sum(-1).mean() - math.log(data["target_std"])
    print(json.dumps({"test_ll": float(ll), "sigma_noise": float(la.sigma_noise) * data["target_std"]}))


if __name__ == "__main__":
    main()
