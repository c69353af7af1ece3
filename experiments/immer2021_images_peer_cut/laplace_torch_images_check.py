"""Peer check for ``immer2021_images`` (and ``_cpu``): is the online-marglik Laplace predictive's
calibration the engine's or the method's?

For one finished ``method=online_kron`` job (its folder), rebuild its network at the weights
online marglik kept (the best-marglik state saved in the job's ``checkpoints/last.ckpt``, which
needs ``checkpoint.enabled=true``, as in ``immer2021_images``), fit our final Laplace as the run
does (KFAC-GGN, the learned layerwise prior, on the same training rows), and fit laplace-torch
0.3's ``KronLaplace`` with the same prior precisions on the same rows. Prints the log marglik of
both and the test accuracy / NLL / ECE / mean confidence of our GLM probit predictive, of
laplace-torch's (``pred_type="glm", link_approx="probit"``) and of the plug-in (MAP) network,
with the largest difference between the two Laplace predictives' probabilities. laplace-torch
is used as a library only.

    PYTHONPATH=src python experiments/immer2021_images_peer_cut/laplace_torch_images_check.py <job folder> [--data-dir DIR] [--peer-batch 32] [--marglik-only]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from laplace_lab.evaluation.metrics import ece
from laplace_lab.training.job_laplace import final_laplace
from laplace_lab.training.predictors import laplace_predictor, map_predictor


def scores(probs: torch.Tensor, y: torch.Tensor) -> str:
    nll = -torch.log(probs[torch.arange(len(y)), y].clamp_min(1e-12)).mean()
    return (f"acc {float((probs.argmax(-1) == y).float().mean()):.4f}  nll {float(nll):.4f}  "
            f"ece {ece(probs, y):.4f}  mean confidence {float(probs.max(-1).values.mean()):.4f}")


def compare(job: Path, data_dir: str | None = None, peer_batch: int = 32, predictive: bool = True) -> dict:
    """Our final Laplace and laplace-torch's on the job's network: ``{"prior", "log_marglik":
    (ours, peer), "probs": (ours, peer, map), "labels"}`` (without ``predictive``: the first two).
    laplace-torch predicts ``peer_batch`` test images at a time (its memory is ``peer_batch * C * P``
    floats; on MLP 500-300 its predictive of the 10000 test images did not finish in 26 minutes here,
    on a third of a core beside two training jobs)."""
    torch.set_num_threads(1)
    try:
        cfg, datamodule, module, ours, metrics = final_laplace(job, data_dir)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(str(err)) from None

    from laplace import KronLaplace  # laplace-torch

    prior = ours.prior_precision.detach().float()
    peer = KronLaplace(module.model, "classification", prior_precision=prior)
    peer.fit(datamodule.train_eval_dataloader(batch_size=cfg.curvature.get("fit_batch_size")))
    log_marglik = (metrics["laplace/log_marglik"], float(peer.log_marginal_likelihood()))
    if not predictive:
        return {"prior": prior, "log_marglik": log_marglik}
    predict_ours, predict_map = laplace_predictor(ours, cfg.predictive), map_predictor(module)
    p_ours, p_peer, p_map, labels = [], [], [], []
    with torch.no_grad():
        for x, y in datamodule.test_dataloader():
            p_ours.append(predict_ours(x))
            # laplace-torch's GLM predictive forms the Jacobians [batch, C, P]: chunked (MLP 500-300: 22 MB per image)
            p_peer.append(torch.cat([peer(xc, pred_type="glm", link_approx="probit") for xc in x.split(peer_batch)]))
            p_map.append(predict_map(x))
            labels.append(y)
    return {"prior": prior, "log_marglik": log_marglik,
            "probs": (torch.cat(p_ours), torch.cat(p_peer), torch.cat(p_map)), "labels": torch.cat(labels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path, help="folder of a finished online_kron job")
    parser.add_argument("--data-dir", default=os.environ.get("LAPLACE_LAB_DATA_DIR"),
                        help="data folder (default: LAPLACE_LAB_DATA_DIR, else the job's paths.data_dir)")
    parser.add_argument("--peer-batch", type=int, default=32,
                        help="test images per laplace-torch predictive call (its Jacobians take batch x C x P floats)")
    parser.add_argument("--marglik-only", action="store_true", help="compare the log marglik only (no predictive)")
    args = parser.parse_args()
    out = compare(args.job, args.data_dir, args.peer_batch, predictive=not args.marglik_only)
    print(f"layerwise prior precisions: {[round(float(p), 4) for p in out['prior']]}")
    print(f"log marglik: ours {out['log_marglik'][0]:.3f}, laplace-torch {out['log_marglik'][1]:.3f}")
    if args.marglik_only:
        return
    (p_ours, p_peer, p_map), y = out["probs"], out["labels"]
    print(f"ours (GLM probit):          {scores(p_ours, y)}")
    print(f"laplace-torch (GLM probit): {scores(p_peer, y)}")
    print(f"MAP (plug-in):              {scores(p_map, y)}")
    print(f"max |p_ours - p_laplace_torch|: {float((p_ours - p_peer).abs().max()):.2e}")


if __name__ == "__main__":
    main()
