"""OmegaConf resolvers used by ``conf/train.yaml`` (sweep subdir), ``conf/hydra/launcher/ray.yaml``
and experiment presets (``lab_if_equal``: a value that depends on the swept method)."""

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


def if_equal(value, expected, then, otherwise):
    """``then`` if ``value == expected`` else ``otherwise``, e.g. in a preset
    ``val_fraction: ${lab_if_equal:${method_name},map_grid,0.1,0.0}`` (a validation split only
    for the method that needs one). A list or dict result comes back as an OmegaConf container, so
    the config still resolves in place."""
    result = then if value == expected else otherwise
    return OmegaConf.create(result) if isinstance(result, (list, dict)) else result


def register_resolvers() -> None:
    for name, fn in (("lab_job_subdir", job_subdir), ("lab_gpus_per_job", gpus_per_job), ("lab_if_equal", if_equal)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
