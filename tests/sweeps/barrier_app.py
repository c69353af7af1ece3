"""``laplace_lab.train`` with a barrier in front of each job, for the fake-GPU launcher tests.

    python tests/sweeps/barrier_app.py -m hydra/launcher=ray ... \
        hydra.job.env_set.LAB_BARRIER_DIR=<dir> hydra.job.env_set.LAB_BARRIER_N=4

Each job touches a file in ``LAB_BARRIER_DIR`` and waits (up to 120 s) until ``LAB_BARRIER_N``
files are there, so jobs that the launcher runs at the same time provably overlap; it then holds
for ``LAB_HOLD_S`` seconds and runs the real job (``laplace_lab.train.run``), or, with
``LAB_LIGHT=1``, only records its devices (a light job: no torch training). The environment comes
through ``hydra.job.env_set``, so it reaches Ray workers of a cluster started elsewhere. The job
goes through ``run_tracked`` like every job of ``laplace_lab.train``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

import laplace_lab.config  # noqa: F401 - registers the schema nodes the option files start from
import laplace_lab.sweeps  # noqa: F401 - registers the resolvers conf/train.yaml uses

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def barrier_run(cfg, output_dir: Path) -> dict[str, float]:
    folder, n = Path(os.environ["LAB_BARRIER_DIR"]), int(os.environ["LAB_BARRIER_N"])
    (folder / f"{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(folder.iterdir())) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(float(os.environ.get("LAB_HOLD_S", "0")))
    if os.environ.get("LAB_LIGHT") == "1":
        return {"val/nll": 0.0}
    from laplace_lab.train import run

    return run(cfg, output_dir)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg) -> float:
    from laplace_lab.sweeps.jobs import run_tracked

    return run_tracked(barrier_run, cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
