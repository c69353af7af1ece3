"""OmegaConf resolvers of Hydra's own config: ``conf/train.yaml`` (the sweep subdir) and
``conf/hydra/launcher/ray.yaml`` (GPUs per job). The job config's resolver (``lab_if_equal``) is
registered by ``laplace_lab.config``."""

from __future__ import annotations

from collections.abc import Iterable

from omegaconf import OmegaConf

from laplace_lab.sweeps.run_only import job_dirname


def job_subdir(overrides: Iterable[str]) -> str:
    """A job's folder name from its task overrides (``hydra:overrides.task``): stable across
    re-runs of the same multirun, run-only keys left out, values normalised (``run_only.job_dirname``)."""
    return job_dirname(list(overrides))


def gpus_per_job() -> int:
    """1 when this machine has a CUDA GPU (Ray then gives each job its own), else 0 (CPU jobs)."""
    import torch

    return 1 if torch.cuda.is_available() else 0


def register_resolvers() -> None:
    for name, fn in (("lab_job_subdir", job_subdir), ("lab_gpus_per_job", gpus_per_job)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
