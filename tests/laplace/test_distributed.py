"""The Laplace fit across processes (``laplace.distributed``): 2 gloo processes on this CPU, one
thread each, every one on its ``DistributedSampler`` shard, against one process on all the data.

One launch of ``dist_worker.py`` per test fits every case of ``dist_worker.CASES`` (kron, diag,
full, their last-layer variants, lowrank; float64 and float32); the reference runs in the test
process (no process group). A second launch kills one rank and checks the other fails fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import dist_worker as w
import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

WORKER = Path(w.__file__)
SRC = Path(__file__).resolve().parents[2] / "src"
WORLD = 2


def launch(mode: str, tmp_path: Path, timeout_s: float, wall_s: float) -> list[tuple]:
    """Run ``WORLD`` worker processes of ``mode``: per rank ``(returncode, stderr, seconds to exit)``;
    fails the test if they are not all done within ``wall_s`` (a hang)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    init = tmp_path / "init"
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(WORKER), mode, str(r), str(WORLD), str(init), str(tmp_path),
                               str(timeout_s)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    ended = [None] * WORLD
    while None in ended and time.monotonic() - start < wall_s:
        for r, p in enumerate(procs):
            if ended[r] is None and p.poll() is not None:
                ended[r] = time.monotonic() - start
        time.sleep(0.05)
    if None in ended:
        for p in procs:
            p.kill()
        pytest.fail(f"worker {mode!r} did not finish within {wall_s} s (a hang)")
    return [(p.returncode, p.stderr.read(), t) for p, t in zip(procs, ended)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    done = launch("fit", tmp, timeout_s=60, wall_s=240)
    for r, (rc, err, _) in enumerate(done):
        assert rc == 0, f"rank {r} failed:\n{err[-3000:]}"
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def reference():
    out = {}
    for case, (_, _, likelihood, dtype, _) in w.CASES.items():
        loader = torch.utils.data.DataLoader(w.data(likelihood, dtype, w.N_TRAIN, 1), batch_size=w.BATCH)
        test_x = w.data(likelihood, dtype, w.N_TEST, 2).tensors[0]
        out[case] = w.run_case(case, loader, test_x)[0]
    return out


def close(a, b, dtype):
    if dtype == torch.float64:
        return torch.allclose(a, b, rtol=0, atol=1e-10 * max(1.0, float(b.abs().max())))
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


@pytest.mark.parametrize("case", list(w.CASES))
def test_two_shards_equal_one_process(case, ranks, reference):
    dtype = w.CASES[case][3]
    ref = reference[case]
    for r, res in enumerate(ranks):
        got = res[case]
        assert got["n_data"] == w.N_TRAIN
        for key in ("lml", "pred", "prior", "lml_tuned", "sample"):
            assert close(got[key], ref[key], dtype), (case, r, key, got[key], ref[key])
    for key in ("lml", "pred", "prior", "sample"):  # every rank holds the same posterior, bit for bit
        assert torch.equal(ranks[0][case][key], ranks[1][case][key]), (case, key)


def test_shard_predictions_gathered_in_order(ranks, reference):
    # 7 test points over 2 ranks: DistributedSampler pads rank 1 with a repeat, which is dropped
    for res in ranks:
        assert close(res["kron"]["gathered"], reference["kron"]["pred_tuned"], torch.float64)


def test_disagreeing_ranks_raise_naming_the_field(ranks):
    for res in ranks:
        assert "disagree on hyper_hash" in res["mismatch"], res["mismatch"]


def test_padded_distributed_sampler_is_refused(ranks):
    for res in ranks:
        assert "pads 41 samples to 42 over 2 processes, so 1 samples would be counted twice" in res["padded"]
        assert "drop_last=True" in res["padded"]


def test_structure_without_reduction_raises_before_the_data_pass(ranks):
    for res in ranks:
        assert "hessian_structure='noreduce_test' declares no reduction" in res["noreduce"]
        assert "'kron'" in res["noreduce"] and "process_group=None" in res["noreduce"]


def test_a_dead_rank_makes_the_other_exit_with_a_message(tmp_path):
    (rc0, err0, _), (rc1, _, _) = launch("die", tmp_path, timeout_s=5, wall_s=120)
    assert rc1 == 3
    assert rc0 != 0
    assert "DistributedFitError" in err0 and "rank 0 of 2" in err0, err0[-3000:]
    assert "the agreement check" in err0


@pytest.mark.slow
def test_a_stalled_rank_makes_the_other_fail_at_the_timeout(tmp_path):
    # rank 1 sleeps (alive, connection open) for 20 s: rank 0 must give up at the 3 s group timeout
    (rc0, err0, t0), (rc1, _, t1) = launch("stall", tmp_path, timeout_s=3, wall_s=120)
    assert rc0 != 0 and "DistributedFitError" in err0 and "0:00:03" in err0, err0[-3000:]
    assert t0 < t1 - 8, (t0, t1)  # rank 0 exited long before the stalled rank woke up


def test_one_process_fits_alone_and_bad_process_group_is_rejected():
    from laplace_lab.laplace import Laplace
    from laplace_lab.laplace.distributed import fit_group

    la = w.make_laplace("diag")
    assert fit_group(la) is None  # no process group initialised: nothing to reduce
    with pytest.raises(ValueError, match="process_group must be 'auto', None or a torch.distributed.ProcessGroup"):
        Laplace(w.model(torch.float64), "classification", process_group="world")


def test_shard_batches_partition_the_loader():
    from laplace_lab.laplace.distributed import ShardBatches

    batches = [torch.full((2,), i) for i in range(5)]
    shards = [list(ShardBatches(batches, 2, r)) for r in range(2)]
    assert [int(b[0]) for b in shards[0]] == [0, 2, 4] and [int(b[0]) for b in shards[1]] == [1, 3]
    with pytest.raises(ValueError, match="0 <= rank < world"):
        ShardBatches(batches, 2, 2)
