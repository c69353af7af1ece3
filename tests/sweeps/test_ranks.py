"""``sweeps.ranks.is_first_process``: which process of a DDP job does its one-off work, from the
environment its launcher set (torchrun, SLURM tasks, Lightning's subprocess launcher)."""

from __future__ import annotations

import pytest

from laplace_lab.sweeps.ranks import is_first_process

VARS = ("RANK", "SLURM_NTASKS", "SLURM_PROCID", "NODE_RANK", "LOCAL_RANK")


@pytest.mark.parametrize("env, first", [
    ({}, True),  # a single process
    ({"RANK": "0", "LOCAL_RANK": "0"}, True),  # torchrun
    ({"RANK": "3", "LOCAL_RANK": "1"}, False),
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, True),  # srun / submitit, one task per GPU
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "2"}, False),
    ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "LOCAL_RANK": "1"}, False),  # one SLURM task: Lightning's children
    ({"LOCAL_RANK": "1", "NODE_RANK": "0"}, False),  # Lightning's subprocess launcher: rank 1
    ({"LOCAL_RANK": "0", "NODE_RANK": "1"}, False),  # first process of the second node
])
def test_first_process(env, first, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert is_first_process() is first
