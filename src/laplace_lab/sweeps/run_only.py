"""The one list of *run-only* config keys, and job/sweep folder names built without them.

A run-only key changes where or how a run writes, logs or is scheduled, never its result:
output paths, loggers, thread counts, checkpoint paths, the MAP cache switch, progress bars.
Three things ignore them, all through this module:

- job folder names (``job_dirname``, the ``lab_job_subdir`` resolver of ``conf/train.yaml``) and
  sweep folder names (``sweep_dirname``): relaunching with ``torch_num_threads=4`` finds the jobs
  finished with 1 thread;
- the sweep's config hash (``sweeps.status.config_fingerprint``): a finished job is not re-run;
- the MAP-cache key (``training.map_cache``).

Hydra's own ``hydra.job.override_dirname`` is not used: this module is the one list.
``WIRING_KEYS`` (``module``, ``callbacks``) only name objects by ``_target_`` (their options are in
the groups): they name job folders like any key, but stay out of the config hash, as the code does.
``SWITCHED_OFF`` nodes (``evaluation.landscape``) stay out of the hash while their ``enabled`` is
false: a feature that is off changes nothing a job computes, so adding one does not make every
finished job run again (``hashed_config``). For the same reason ``ADDED_AT_DEFAULT`` options stay out
of the hash at the value that keeps the behaviour from before they existed.

``RUN_ONLY_KEYS`` are top-level keys dropped whole; ``RUN_ONLY_SUBKEYS[group]`` are keys dropped
inside a group. Override values are normalised in names (``1``, ``1.0`` and ``1e0`` are one job:
``normalize_value``, ``normalized_overrides``), so one value never makes two folders. (Tables
group jobs by their own number-as-number key, ``laplace_lab.reporting.tables``.)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

RUN_ONLY_KEYS = ("paths", "logger", "aggregate", "experiment_name", "map_cache", "torch_num_threads")
RUN_ONLY_SUBKEYS = {
    "trainer": ("enable_progress_bar", "enable_model_summary", "log_every_n_steps", "loop"),
    "evaluation": ("progress",),
    "data": ("data_dir",),
    "checkpoint": ("dirpath", "resume_from", "every_n_epochs", "enabled"),
}
# Command-line keys that are not config values but still never name a job: the preset choice
# (the sweep folder is named by it) and Hydra's own groups.
RUN_ONLY_OVERRIDES = ("experiment", "hydra")
MAX_NAME_CHARS = 200
WIRING_KEYS = ("module", "callbacks")
SWITCHED_OFF = ("evaluation.landscape",)  # nodes with an ``enabled`` switch, hashed only when on
# options added after jobs had finished, and the value that computes what those jobs computed
ADDED_AT_DEFAULT = {"het_head": "softplus", "predictive.het_approx": "mean", "data.dtype": "float32",
                    "trainer.strategy": "auto", "trainer.num_nodes": 1, "trainer._target_": "pytorch_lightning.Trainer"}


def hashed_config(data: dict[str, Any]) -> dict[str, Any]:
    """What the sweep's config hash covers: the resolved job config less run-only keys, wiring nodes
    (``WIRING_KEYS``), the ``hydra`` node, the ``SWITCHED_OFF`` nodes that are off and the
    ``ADDED_AT_DEFAULT`` options at that value (the caller's dict is left alone)."""
    out = {k: v for k, v in strip_run_only(data).items() if k not in WIRING_KEYS and k != "hydra"}
    for dotted in SWITCHED_OFF:
        node = _node(out, dotted)
        if isinstance(node, dict) and not node.get("enabled"):
            _drop(out, dotted)
    for dotted, value in ADDED_AT_DEFAULT.items():
        if _node(out, dotted, missing=object()) == value:
            _drop(out, dotted)
    return out


def _node(data: dict[str, Any], dotted: str, missing: Any = None) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return missing
        data = data[part]
    return data


def _drop(data: dict[str, Any], dotted: str) -> None:
    """Remove ``dotted`` from ``data``, copying the dicts on its path first."""
    *parents, last = dotted.split(".")
    for part in parents:
        data[part] = dict(data[part])
        data = data[part]
    del data[last]


def strip_run_only(data: dict[str, Any], keys: tuple[str, ...] = RUN_ONLY_KEYS,
                   subkeys: dict[str, tuple[str, ...]] = RUN_ONLY_SUBKEYS) -> dict[str, Any]:
    """A copy of a resolved config (plain dict) without ``keys`` and the ``subkeys`` of its groups
    (by default the run-only ones; the MAP cache passes a longer list)."""
    out = {k: v for k, v in data.items() if k not in keys}
    for key, names in subkeys.items():
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k not in names}
    return out


def is_run_only(key: str) -> bool:
    """Whether a (dotted) override key, e.g. ``logger.wandb.enabled`` or ``+torch_num_threads``, is run-only."""
    key = key.lstrip("+~").split("@", 1)[0]
    head, _, rest = key.partition(".")
    if head in RUN_ONLY_KEYS or head in RUN_ONLY_OVERRIDES or head.startswith("hydra/"):
        return True
    return bool(rest) and rest.split(".", 1)[0] in RUN_ONLY_SUBKEYS.get(head, ())


def normalize_value(value: Any) -> Any:
    """Numbers in one canonical spelling: integral values as ints (``1.0`` -> ``1``), other floats
    by ``repr`` (``1e-3`` -> ``0.001``); everything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def _value_text(override) -> str:
    """The value of a parsed override as text, numbers normalised (sweeps and lists as typed)."""
    if override.is_sweep_override():
        return override.input_line.split("=", 1)[1]
    value = override.value()
    normalized = normalize_value(value)
    return str(normalized) if normalized is not value else override.get_value_element_as_str()


def parse_value(value: str):
    """The Hydra ``Override`` of ``key=<value>``: one override value as typed, read by Hydra's own
    parser (types, quoting, lists). Raises Hydra's ``OverrideParseException`` on bad text."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(f"key={value}")


def normalized_overrides(overrides: Iterable[str]) -> list[str]:
    """``key=value`` lines of the overrides that are not run-only, values normalised, sorted.

    Sweep overrides (``seed=0,1``) are kept as typed; Hydra's parser reads quoting and types."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = []
    for override in OverridesParser.create().parse_overrides([str(o) for o in overrides]):
        if is_run_only(override.get_key_element()):
            continue
        if override.is_delete():
            lines.append(override.input_line)
            continue
        lines.append(f"{override.get_key_element()}={_value_text(override)}")
    return sorted(lines)


def safe_name(name: str, empty: str) -> str:
    """One path component: ``/`` becomes ``_``, ``empty`` when blank, long names cut with a hash."""
    name = str(name).replace("/", "_") or empty
    if len(name) > MAX_NAME_CHARS:
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        name = f"{name[:MAX_NAME_CHARS - 13]}-{digest}"
    return name


def job_dirname(overrides: Iterable[str]) -> str:
    """A job's folder name from its task overrides (``default`` when none is left)."""
    return safe_name(",".join(normalized_overrides(overrides)), "default")


DEFAULT_SWEEPER = "basic"


def sweeper_choice(hydra_overrides: Iterable[str]) -> str | None:
    """The ``hydra/sweeper=<name>`` choice among a command's Hydra overrides (None when not given)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found = None
    for override in OverridesParser.create().parse_overrides([str(o) for o in hydra_overrides]):
        if override.get_key_element().lstrip("+~") == "hydra/sweeper" and not override.is_delete():
            found = str(override.value())
    return found


def sweep_dirname(overrides: Iterable[str], sweeper: str | None = None) -> str:
    """A sweep's folder name from the command's task overrides and the sweeper it chose on the command
    line: ``multirun`` when only run-only keys (and the preset) are given, else
    ``multirun_<overrides>``; a sweeper other than ``basic`` comes first (``multirun_map_grid_<overrides>``),
    so an Optuna, a grid and a basic sweep over the same overrides never share a folder."""
    name = ",".join(normalized_overrides(overrides))
    parts = [p for p in ("multirun", None if sweeper in (None, DEFAULT_SWEEPER) else sweeper, name) if p]
    return safe_name("_".join(parts), "multirun")
