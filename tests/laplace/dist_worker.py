"""Cases and the worker process of tests/laplace/test_distributed.py.

``python dist_worker.py MODE RANK WORLD INIT_FILE OUT_DIR TIMEOUT_S`` joins a gloo process group
(one thread) and runs ``MODE``: "fit" (every case of ``CASES`` on this rank's shard, results
saved to ``OUT_DIR/rank{RANK}.pt``), "die" (rank 1 exits with code 3 after joining; rank 0 fits
and must fail in the reduction's collective) or "stall" (rank 1 sleeps 20 s instead: rank 0 must
fail at the group timeout). The test imports ``run_case`` for the one-process
reference.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
from torch import nn

N_TRAIN, N_TEST, BATCH = 40, 7, 8


def model(dtype, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.LayerNorm(5), nn.Linear(5, 4), nn.Tanh(),
                         nn.Linear(4, 2)).to(dtype)


def data(likelihood, dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g).to(dtype)
    y = torch.randint(0, 2, (n,), generator=g) if likelihood == "classification" else \
        torch.randn(n, 2, generator=g).to(dtype)
    return torch.utils.data.TensorDataset(X, y)


# (hessian_structure, subset_of_weights, likelihood, dtype, structure options)
CASES = {
    "kron": ("kron", "all", "classification", torch.float64, {}),
    "kron_regression": ("kron", "all", "regression", torch.float64, {}),
    "diag": ("diag", "all", "classification", torch.float64, {}),
    "full": ("full", "all", "regression", torch.float64, {}),
    "kron_last_layer": ("kron", "last_layer", "classification", torch.float64, {}),
    "diag_last_layer": ("diag", "last_layer", "regression", torch.float64, {}),
    "full_last_layer": ("full", "last_layer", "classification", torch.float64, {}),
    "lowrank": ("lowrank", "all", "classification", torch.float64, {"n_eigs": 6}),
    "kron_f32": ("kron", "all", "classification", torch.float32, {}),
    "diag_f32": ("diag", "all", "regression", torch.float32, {}),
    "full_f32": ("full", "all", "classification", torch.float32, {}),
}


def make_laplace(case, **kw):
    from laplace_lab.laplace import Laplace

    structure, subset, likelihood, dtype, opts = CASES[case]
    net = model(dtype)
    la = Laplace(net, likelihood, subset_of_weights=subset, hessian_structure=structure,
                 prior_precision=0.5, sigma_noise=0.7 if likelihood == "regression" else 1.0, **opts, **kw)
    if structure == "lowrank":
        la.structure.n_steps = la.n_params  # a complete Krylov basis: the top pairs to round-off
    return la


def sharded(ds, rank, world):
    """``(loader, indices)`` of this rank's ``DistributedSampler`` shard (no shuffling)."""
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, sampler=sampler), list(sampler)


def run_case(case, train_loader, test_x, **kw) -> dict:
    """``(results, la)``: fit, then log marglik, the glm predictive at ``test_x``, 20 marglik prior steps,
    3 seeded samples and (classification) the predictive with the tuned prior."""
    la = make_laplace(case, **kw)
    la.fit(train_loader)
    out = {"n_data": la.n_data, "lml": la.log_marginal_likelihood().detach()}
    pred = la(test_x, pred_type="glm")
    out["pred"] = torch.cat([p.reshape(len(test_x), -1) for p in pred], 1) if isinstance(pred, tuple) else pred
    la.optimize_prior_precision(method="marglik", n_steps=20, lr=0.1)
    out["prior"] = la.prior_precision.detach()
    out["lml_tuned"] = la.log_marginal_likelihood().detach()
    out["sample"] = la.sample(3, generator=torch.Generator().manual_seed(5))
    out["pred_tuned"] = la(test_x, pred_type="glm") if likelihood_of(case) == "classification" else None
    return out, la


def likelihood_of(case):
    return CASES[case][2]


def _fit_mode(rank, world, out_dir):
    import torch.distributed as dist

    from laplace_lab.laplace.distributed import DistributedMismatchError, gather_ordered
    from laplace_lab.laplace.structures import DiagStructure, register

    results = {}
    for case, (_, _, likelihood, dtype, _) in CASES.items():
        loader, _ = sharded(data(likelihood, dtype, N_TRAIN, 1), rank, world)
        test = data(likelihood, dtype, N_TEST, 2)
        out, la = run_case(case, loader, test.tensors[0])
        if case == "kron":  # the predictive of a sharded test loader, gathered in data order
            test_loader, idx = sharded(test, rank, world)
            local = torch.cat([la(X, pred_type="glm") for X, _ in test_loader])
            out["gathered"] = gather_ordered(local, idx)
        results[case] = out
    # ranks that disagree (rank 1 another prior precision) fail on every rank, naming the field
    loader, _ = sharded(data("classification", torch.float64, N_TRAIN, 1), rank, world)
    la = make_laplace("kron")
    la.prior_precision = 0.5 + rank
    try:
        la.fit(loader)
        results["mismatch"] = "no error"
    except DistributedMismatchError as e:
        results["mismatch"] = str(e)

    padded, _ = sharded(data("classification", torch.float64, N_TRAIN + 1, 1), rank, world)
    try:
        make_laplace("diag").fit(padded)
        results["padded"] = "no error"
    except ValueError as e:
        results["padded"] = str(e)

    @register
    class NoReduce(DiagStructure):  # a structure that declares no reduction
        name = "noreduce_test"
        shard_reduction = None

    from laplace_lab.laplace import Laplace

    try:
        Laplace(model(torch.float64), "classification", "all", hessian_structure="noreduce_test").fit(loader)
        results["noreduce"] = "no error"
    except ValueError as e:
        results["noreduce"] = str(e)
    results["world"] = dist.get_world_size()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def _die_mode(rank, world, stall: bool):
    import time

    import torch.distributed as dist

    loader, _ = sharded(data("classification", torch.float64, N_TRAIN, 1), rank, world)
    la = make_laplace("kron")  # imports and builds before the barrier: after it, rank 0 only fits
    dist.barrier()  # both joined
    if rank == 1 and stall:
        time.sleep(20)
        os._exit(0)
    if rank == 1:
        os._exit(3)
    la.fit(loader)  # raises DistributedFitError in fit_end's agreement check


def main(argv):
    mode, rank, world, init_file, out_dir, timeout_s = argv
    rank, world = int(rank), int(world)
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=float(timeout_s)))
    if mode == "fit":
        _fit_mode(rank, world, out_dir)
    else:
        _die_mode(rank, world, stall=mode == "stall")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
