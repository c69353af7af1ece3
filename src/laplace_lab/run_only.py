"""Config keys that do not change a run's result (where it writes, how it logs, thread count).

One list for every place that must ignore them: the sweep's ``config_fingerprint``
(``laplace_lab.sweeps.status``), the MAP cache key (``laplace_lab.training.map_cache``) and the
job folder names (``hydra.job.config.override_dirname.exclude_keys`` in ``conf/train.yaml``
should name the same keys). ``strip_run_only`` removes them from a plain config dict.
"""

from __future__ import annotations

from typing import Any

RUN_ONLY_KEYS = ("paths", "logger", "aggregate", "experiment_name", "map_cache", "torch_num_threads")
RUN_ONLY_SUBKEYS = {"trainer": ("enable_progress_bar", "enable_model_summary", "log_every_n_steps"),
                    "evaluation": ("progress",), "data": ("data_dir",)}


def strip_run_only(data: dict[str, Any], keys: tuple[str, ...] = RUN_ONLY_KEYS,
                   subkeys: dict[str, tuple[str, ...]] = RUN_ONLY_SUBKEYS) -> dict[str, Any]:
    """A copy of the resolved config ``data`` without ``keys`` and the ``subkeys`` of its groups."""
    data = {k: v for k, v in data.items() if k not in keys}
    for key, names in subkeys.items():
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if k not in names}
    return data


def override_exclude_keys() -> list[str]:
    """The run-only keys as Hydra override keys (``logger``, ``logger.wandb.mode``, ...), for
    ``hydra.job.config.override_dirname.exclude_keys``, which matches override keys exactly."""
    from laplace_lab.config_values import group_schema

    keys: list[str] = []
    for key in RUN_ONLY_KEYS:
        keys.append(key)
        try:
            keys += [f"{key}.{sub}" for sub in group_schema(key)]
        except (KeyError, TypeError, AttributeError):  # a scalar root key (experiment_name, ...)
            pass
    keys += [f"{group}.{sub}" for group, subs in RUN_ONLY_SUBKEYS.items() for sub in subs]
    return keys
