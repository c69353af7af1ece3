"""``trainer=ddp``: the config group (its options refused with their allowed values)."""

from __future__ import annotations

import pytest

from tests.conftest import run_config

# online marglik on the 1-D sinusoid (150 training rows, full batch): on 2 processes each rank's batch
# is its half (data.batch_size=75), so the averaged gradient is the one-process full-batch gradient
COMMON = ["data=sinusoid", "method=online_full", "model=mlp", "model.widths=[20]", "optimizer.lr=1e-2",
          "marglik.frequency=5", "marglik.burnin=5", "marglik.n_steps=10", "logger=csv",
          "trainer.enable_progress_bar=false", "evaluation=regression", "evaluation.progress=false",
          "torch_num_threads=1"]
DDP = ["trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "data.batch_size=75"]
RESUME = ["checkpoint.enabled=true", "checkpoint.resume_from=last"]
EPOCHS = 100  # the kill below lands within a few epochs of the first checkpoint (the test checks it was mid-run)
LAUNCH_TIMEOUT_S = 300


# --- the config group -----------------------------------------------------------------------------
def test_ddp_group_composes_for_two_cpu_processes():
    t = run_config(["data=sinusoid", *DDP]).trainer
    assert (t.strategy, t.devices, t.num_nodes, t.accelerator) == ("ddp", 2, 1, "cpu")
    assert t.lightning_kwargs()["strategy"] == "ddp"
    default = run_config(["data=sinusoid"]).trainer
    assert (default.strategy, default.num_nodes) == ("auto", 1)


@pytest.mark.parametrize("overrides, message", [
    (["trainer=ddp", "trainer.strategy=fsdp"], "trainer.strategy='fsdp' is not supported; allowed: ['auto', 'ddp']"),
    (["trainer=ddp", "trainer.num_nodes=0"], "trainer.num_nodes must be >= 1"),
    (["trainer=ddp", "trainer.devices=0"], "trainer.devices=0 is not supported; allowed: an integer >= 1"),
    (["trainer=ddp", "trainer.devices=[0,0]"], "trainer.devices=[0, 0] is not supported"),
    (["trainer=ddp", "trainer.devices=two"], "trainer.devices='two' is not supported"),
    (["trainer.devices=2"], "it needs trainer.strategy=ddp (trainer=ddp); got trainer.strategy='auto'"),
    (["trainer.num_nodes=2"], "it needs trainer.strategy=ddp"),
    (["trainer=ddp", "method=map_grid", "map_grid=[1.0,2.0]"], "not supported with it: map_grid"),
    (["trainer=ddp", "method=online_kron", "marglik.fused=true"], "not supported with it: marglik.fused=true"),
    (["trainer=ddp", "trainer.loop=plain"], "trainer.loop=plain cannot run this config"),
])
def test_bad_trainer_options_are_refused(overrides, message):
    from laplace_lab.training.loop_choice import choose_loop

    with pytest.raises(ValueError) as err:
        choose_loop(run_config(["data=sinusoid", *overrides]))
    assert message in str(err.value)
