"""Resumable multiruns: per-job status markers, skip-if-finished, and the end-of-sweep summary.

- ``status``: the ``status.json`` marker of a job folder and the run's provenance (git, hardware).
- ``jobs``: ``run_tracked(run_fn, cfg, output_dir)``, the wrapper ``train.main`` calls.
- ``callback``: ``SweepSummary``, the Hydra callback that names and locks the sweep folder and
  writes ``<sweep dir>/summary.json``.
- ``run_only``: the one list of run-only config keys (kept out of folder names and hashes).
- ``lock``: one launch at a time per sweep folder.
- ``devices``: the ``trainer=gpu`` check and the devices a job records in ``status.json``.
- ``progress``: each job's state and saved epochs; ``records``: finished jobs saved without
  machine paths and restored on another machine, so a sweep can span machines.
- ``signals``: SIGTERM / SIGINT mark the job failed, write the summary and exit non-zero.
- ``superseded``: an earlier attempt's wandb runs moved out of the way of a rerun's.

Importing the package registers the OmegaConf resolvers the Hydra configs use
(``lab_job_subdir``, ``lab_gpus_per_job``) and the output filters of ``laplace_lab.io.quiet_logs``;
``laplace_lab.train`` imports it.
"""

from __future__ import annotations

from laplace_lab.io import quiet_logs
from laplace_lab.sweeps.resolvers import register_resolvers
from laplace_lab.sweeps.status import STATUS_FILE, is_finished, read_status

register_resolvers()
# among them Hydra's warning that conf/hydra/launcher/{ray,submitit_*}.yaml share the plugins'
# schema names (on purpose: so Hydra validates them, and a typo in hydra.launcher.* fails)
quiet_logs.install()

__all__ = ["STATUS_FILE", "is_finished", "read_status", "register_resolvers"]
