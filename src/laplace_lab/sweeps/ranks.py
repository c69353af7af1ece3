"""``is_first_process()``: whether this process is rank 0 of a multi-process (DDP) job, as its launcher
set the environment before any training; rank 0 alone does the job's one-off work (the run-folder
lock, ``status.json``, ``progress.json``).

Read: ``RANK`` (torchrun), ``SLURM_PROCID`` when ``SLURM_NTASKS`` > 1 (srun / submitit with several
tasks: Lightning's ``SLURMEnvironment`` takes the global rank from it), and Lightning's subprocess
launcher's ``NODE_RANK`` / ``LOCAL_RANK`` (set for the processes it starts, ranks 1..N-1; rank 0 is
the launched process, which has neither). None set: a single process, the first. After training
starts, ``trainer.global_rank`` is the authority; this is for what comes before it.
"""

from __future__ import annotations

import os


def _int(name: str) -> int:
    return int(os.environ.get(name) or 0)


def is_first_process() -> bool:
    """True for the process that does the job's one-off work; False for the other ranks."""
    if os.environ.get("RANK"):
        return _int("RANK") == 0
    if _int("SLURM_NTASKS") > 1 and os.environ.get("SLURM_PROCID"):
        return _int("SLURM_PROCID") == 0
    return _int("NODE_RANK") == 0 and _int("LOCAL_RANK") == 0
