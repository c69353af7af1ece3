"""Aggregate the finished jobs of multiruns into ``<name>.md``, ``<name>.csv`` and ``<name>.jobs.csv``.

    python -m laplace_lab.reporting.tables outputs/<experiment>/multirun --name <name> \
        [--metrics test/map/acc test/la/nll] [--group-by model curvature] [--seed-keys seed data.split] \
        [--figures reliability] [--results-dir DIR | --commit-results] [--preset P] [--reference FILE] \
        [--allow-mixed] [--allow-mixed-launches] [--allow-smaller]

Tables go to the (first) multirun folder unless ``--results-dir``. A table name is a plain name,
never a path (``io.names``). Only ``--commit-results`` writes into the repository's ``results/`` (a
``--results-dir`` under it is refused), with ``--preset`` and that preset's own table name (or
``<name>_<suffix>``, a variant of it), and it refuses to replace a committed table by one with fewer jobs, seeds or rows unless ``--allow-smaller``
(``table_commit``), and it refuses jobs of a smoke variant (``experiment=<preset>/smoke``: one seed,
a few epochs; their table carries a "SMOKE RUN" section). The jobs must come from one clean commit (no
modified, untracked, or ignored package files at job start) that contains
the preset (``experiments/<preset>/preset.yaml``), and from one launch command (less run-only overrides), or the
command refuses: ``--allow-mixed`` / ``--allow-mixed-launches`` write anyway, with the problems in
the header and the commit of every row. Non-finite metric values are left out of the cells (and
counted, per run; an integer too large for a float counts as inf), unreadable job files are listed,
so are the failed and unfinished jobs left out (with their state and error), and two jobs with the same overrides (less
run-only keys) are refused. With a preset, ``experiments/*/reference.yaml`` files of that preset
add a "Reference numbers" section (``laplace_lab.reporting.reference``). A metric named ``mean(<pattern>)``
is computed per job from its logged metrics (``laplace_lab.reporting.derived_metrics``), e.g.
``mean(shift/rot_*/la/ece)``: the ECE averaged over the rotated-MNIST angles.

Every job folder under the given multirun folders with a ``metrics.json`` (and, when it has a
``status.json`` marker, state ``finished``) is one run. Runs are grouped by the method keys: by
default every key of the jobs' ``.hydra/overrides.yaml`` except the seed keys (``seed``,
``data.split``) and run-only keys (``sweeps.run_only``: also the preset choice and Hydra's groups); numbers written differently (``1``, ``1.0``) are one value. A group-by key is
looked up in the job's overrides, then its config-group choices (``model``, ``curvature``, ...),
then its resolved config (``curvature.hessian_structure``); ``devices.<field>`` (e.g.
``devices.cuda_visible_devices``, ``devices.torch_device``) groups by the device a job recorded in
its ``status.json``, so ``--group-by devices.accelerator`` reports per device. Each cell is mean +- standard error
(sample std / sqrt(n)) over the group's finite values, with n. All three files carry the provenance
(git commit and dirty flag at job start, the command, the seeds, the hardware, the wall time; paths
relative to the repository); the CSVs as leading ``# `` lines (``pandas.read_csv(path, comment="#")``).

``--figures`` copies ``figures/<fig>.png`` of each group's first seed next to the table; the
names of ``laplace_lab.reporting.figures.TABLE_FIGURES`` are drawn from the jobs' ``csv/metrics.csv``
instead (per-epoch means over the seeds, one line per group, one figure).
Also called by the ``SweepSummary`` callback at the end of a multirun when the config has a root
``aggregate: {name, metrics, group_by, seed_keys, results_dir, figures, model_selection}`` (or
``hydra.callbacks.sweep_summary.aggregate``), through ``aggregate_sweep``: the jobs of that launch,
written into the sweep folder (``results_dir``: a relative folder under it), never into
``results/``; provenance problems do not stop it but are stated in the header.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import logging
import math
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from laplace_lab.config.presets import EXPERIMENTS_DIR as PRESETS_DIR
from laplace_lab.config.presets import is_smoke_choice, preset_names, preset_path
from laplace_lab.io.atomic import write_texts_together
from laplace_lab.io.names import check_name, inside
from laplace_lab.reporting import reference as ref
from laplace_lab.reporting.derived_metrics import add_derived
from laplace_lab.reporting.figures import TABLE_FIGURES
from laplace_lab.reporting.figures import draw as draw_table_figure
from laplace_lab.reporting.model_selection import rank_candidates, validate_spec
from laplace_lab.reporting.model_selection import to_markdown as selection_markdown
from laplace_lab.reporting.provenance import (
    HEADER_LIST_MAX,
    UNRECORDED,
    commit_problems,
    is_run_only,
    launch_problems,
    portable_command,
    portable_path,
    preset_files,
    run_commit,
    run_launches,
)
from laplace_lab.reporting.summary_stats import mean_se
from laplace_lab.reporting.table_commit import (
    TableShape,
    check_replacement,
    seed_set,
    settled_table,
    table_journal,
)
from laplace_lab.reporting.table_spec import Admission, TableSpec
from laplace_lab.sweeps import run_only
from laplace_lab.sweeps.run_only import parse_value
from laplace_lab.sweeps.status import (
    DEVICE_FIELDS,
    ENTRY,
    REPO_ROOT,
    STATUS_FILE,
    device_texts,
    hardware,
    last_launch_id,
    read_json_file,
)
from laplace_lab.sweeps.status import job_seconds as status_job_seconds

log = logging.getLogger(__name__)
DEVICE_PREFIX = "devices."
DEFAULT_SEED_KEYS = ("seed", "data.split")
MISSING = "-"
ABSENT_METRICS = ("error", "omit")  # what aggregate does with a metric no run has
COMMITTED_RESULTS = REPO_ROOT / "results"  # only --commit-results writes here
TABLE_NAME = "table name (--name, aggregate.name)"
EXPERIMENTS_DIR = PRESETS_DIR  # experiments/<preset>/: preset.yaml, reference*.yaml (config.presets)


class ProvenanceError(ValueError):
    """The jobs of a table are not from one clean commit / one launch command, or repeat a job."""


@dataclass
class Run:
    """One finished job: its folder, metrics, overrides, config-group choices and resolved config."""

    path: Path
    metrics: dict[str, float]
    overrides: dict[str, str] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)

    def value(self, key: str) -> str:
        """The run's value of ``key`` as text (overrides, then group choices, then config);
        ``devices.<field>`` (``sweeps.status.DEVICE_FIELDS``) is the device the job recorded in
        ``status.json``, e.g. ``devices.cuda_visible_devices``."""
        if key.startswith(DEVICE_PREFIX) and key[len(DEVICE_PREFIX):] in DEVICE_FIELDS:
            recorded = device_texts(self.status)[key[len(DEVICE_PREFIX):]]
            return MISSING if recorded is None else recorded
        if key in self.overrides:
            return _override_text(self.overrides[key])
        if key in self.choices:
            return str(self.choices[key])
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return MISSING if isinstance(node, dict) else _text(node)


@dataclass
class Loaded:
    """The finished runs of some multirun folders, and the job folders that could not be read."""

    runs: list[Run]
    unreadable: list[tuple[Path, str]]  # (job folder, why)
    not_finished: int                   # folders with a running / failed marker (not runs)
    left_out: list[tuple[Path, str]] = field(default_factory=list)  # (job folder, its state and why)


def _text(value: Any) -> str:
    """A config value as text; lists compact (``[500,300]``, as a Hydra override writes them)."""
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


@functools.lru_cache(maxsize=4096)
def _override_text(text: str) -> str:
    """An override's value as text: a list override parsed as Hydra parses it and written in
    ``_text``'s form, so ``model.widths=[50, 50]`` and a config's ``widths: [50, 50]`` are one value
    (and ``[1e-3]`` is ``[0.001]``); anything else as written."""
    if not text.startswith("["):
        return text
    from hydra.errors import HydraException

    try:
        value = parse_value(text).value()
    except HydraException:
        return text
    return _text(value) if isinstance(value, list) else text


def _norm(text: str) -> str:
    """Numbers compare as numbers (``1`` and ``1.0`` are one value); other text as is."""
    try:
        return repr(float(text))
    except ValueError:
        return text


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["seed=1", "+a.b=2", "~c"]`` -> ``{"seed": "1", "a.b": "2"}`` (deletions and hydra.* dropped)."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            continue
        key, value = item.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith(("hydra.", "hydra/")):
            continue
        out[key] = value
    return out


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def as_float(value: int | float) -> float:
    """A metric as a float; an integer too large for one (``10**400``) as +-inf, which the table then
    leaves out of its cells and lists as non-finite."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def not_finished_reason(job_dir: Path) -> str:
    """Why a job folder with a marker is not a finished run: its state, and the error of a failed one."""
    status = json.loads((job_dir / STATUS_FILE).read_text())
    state = status.get("state")
    if state == "failed":
        signal = status.get("interrupted")
        return f"failed ({'interrupted by ' + signal if signal else status.get('error') or 'no error recorded'})"
    if state == "running":
        return "unfinished (state running: still running, or killed before its end)"
    return f"state {state!r}"


def load_run(job_dir: Path) -> tuple[Run | None, str | None]:
    """(run, None) for a finished run; (None, None) when it is not finished; (None, why) when a
    file of the job cannot be read."""
    status = None
    if (job_dir / STATUS_FILE).exists():
        status, error = read_json_file(job_dir / STATUS_FILE)
        if error:
            return None, error
        if status.get("state") != "finished":
            return None, None
    if not (job_dir / "metrics.json").is_file():
        return None, f"{STATUS_FILE} says finished but metrics.json is missing"
    metrics, error = read_json_file(job_dir / "metrics.json")
    if error:
        return None, error
    try:
        hydra_cfg = (_load_yaml(job_dir / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
        overrides = parse_overrides(_load_yaml(job_dir / ".hydra" / "overrides.yaml") or [])
        config = _load_yaml(job_dir / "config_resolved.yaml") or {}
    except (OSError, yaml.YAMLError, AttributeError, TypeError) as err:
        return None, f"its Hydra config files cannot be read ({type(err).__name__}: {err})"
    return Run(
        path=job_dir,
        metrics={k: as_float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
        overrides=overrides,
        choices=dict((hydra_cfg.get("runtime") or {}).get("choices") or {}),
        config=config,
        status=status or {},
    ), None


def load_runs(sweep_dirs: list[Path], launch_id: str | None = None) -> Loaded:
    """Every finished run under ``sweep_dirs`` (when ``launch_id`` is given: the runs that launch
    ran or skipped, ``status.last_launch_id``)."""
    loaded = Loaded([], [], 0)
    for sweep_dir in sweep_dirs:
        if not Path(sweep_dir).is_dir():
            raise FileNotFoundError(f"multirun folder {sweep_dir} does not exist")
        jobs = {p.parent for name in ("metrics.json", STATUS_FILE) for p in Path(sweep_dir).rglob(name)}
        for job_dir in sorted(jobs):
            run, error = load_run(job_dir)
            if error:
                loaded.unreadable.append((job_dir, error))
                log.warning("Left out job %s: %s", job_dir, error)
            elif run is None:
                loaded.not_finished += 1
                why = not_finished_reason(job_dir)
                loaded.left_out.append((job_dir, why))
                log.warning("Left out job %s: %s", job_dir, why)
            elif launch_id is None or last_launch_id(run.status) == launch_id:
                loaded.runs.append(run)
    return loaded


def nonfinite_values(runs: list[Run], metrics: list[str]) -> list[tuple[Path, str, float]]:
    """(job folder, metric, value) of every NaN / inf among ``metrics``."""
    return [(r.path, m, r.metrics[m]) for r in runs for m in metrics
            if m in r.metrics and not math.isfinite(r.metrics[m])]


def duplicate_jobs(runs: list[Run]) -> list[list[Run]]:
    """Groups of runs with the same overrides, less run-only keys (numbers compared as numbers)."""
    by_key: dict[tuple, list[Run]] = {}
    for run in runs:
        key = tuple(sorted((k, _norm(v)) for k, v in run.overrides.items() if not is_run_only(k)))
        by_key.setdefault(key, []).append(run)
    return [group for group in by_key.values() if len(group) > 1]


def default_group_by(runs: list[Run], seed_keys: tuple[str, ...]) -> list[str]:
    """Every override key of the runs, in first-seen order, less seed and run-only keys (the preset
    choice and Hydra's groups included: ``sweeps.run_only.is_run_only``)."""
    keys: list[str] = []
    for run in runs:
        for key in run.overrides:
            if key not in keys and key not in seed_keys and not run_only.is_run_only(key):
                keys.append(key)
    return keys


def default_metrics(runs: list[Run]) -> list[str]:
    """Every metric any run reports, sorted, less the ``time/*`` ones."""
    return sorted({k for run in runs for k in run.metrics if not k.startswith("time/")})


def group_runs(runs: list[Run], group_by: list[str]) -> dict[tuple[str, ...], list[Run]]:
    """Runs by their group-by values (first-seen order; ``1`` and ``1.0`` are one group), keyed by
    the first run's values as text."""
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(_norm(run.value(k)) for k in group_by), []).append(run)
    return {tuple(members[0].value(k) for k in group_by): members for members in groups.values()}


def _commit_label(run: Run) -> str:
    git = run.status.get("git") or {}
    commit = run_commit(run)
    return (commit[:12] if commit != UNRECORDED else commit) + ("" if git.get("dirty") is False else "+dirty")


def group_rows(runs: list[Run], group_by: list[str], metrics: list[str],
               seed_keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per group: the key values, n, the seeds, the commits, ``<metric>`` -> (mean, se, n)
    over the finite values, and ``nonfinite`` -> {metric: count of NaN / inf values left out}."""
    rows = []
    for key, members in group_runs(runs, group_by).items():
        row: dict[str, Any] = dict(zip(group_by, key))
        row["n"] = len(members)
        seeds = {" ".join(f"{s}={r.value(s)}" for s in seed_keys if r.value(s) != MISSING) for r in members}
        row["seeds"] = ", ".join(sorted(seeds, key=_natural))
        row["commits"] = ", ".join(sorted({_commit_label(r) for r in members}))
        row["nonfinite"] = {}
        for m in metrics:
            values = [r.metrics[m] for r in members if m in r.metrics]
            row[m] = mean_se([v for v in values if math.isfinite(v)])
            row["nonfinite"][m] = sum(not math.isfinite(v) for v in values)
        rows.append(row)
    return rows


def copy_figures(runs: list[Run], group_by: list[str], figures: list[str], seed_keys: tuple[str, ...],
                 out_dir: Path) -> list[tuple[str, str, Path]]:
    """Copy ``figures/<fig>.png`` of each group's first seed to ``out_dir``; (group, fig, path) each.
    Names in ``table_figures.TABLE_FIGURES`` are drawn instead, one figure over all groups."""
    copied = []
    labelled = {",".join(f"{k}={v}" for k, v in zip(group_by, key)) or "all": [r.path for r in members]
                for key, members in group_runs(runs, group_by).items()}
    for fig in [f for f in figures if f in TABLE_FIGURES]:
        drawn = draw_table_figure(fig, labelled, out_dir / f"{fig}.png")
        if drawn is not None:
            copied.append(("all groups", fig, drawn))
    figures = [f for f in figures if f not in TABLE_FIGURES]
    for key, members in group_runs(runs, group_by).items():
        label = ",".join(f"{k}={v}" for k, v in zip(group_by, key)) or "all"
        first = sorted(members, key=lambda r: [_natural(r.value(s)) for s in seed_keys])
        for fig in figures:
            src = next((r.path / "figures" / f"{fig}.png" for r in first
                        if (r.path / "figures" / f"{fig}.png").is_file()), None)
            if src is None:
                continue
            out_dir.mkdir(parents=True, exist_ok=True)
            dst = out_dir / f"{label.replace('/', '_')}__{fig}.png"
            shutil.copyfile(src, dst)
            copied.append((label, fig, dst))
    return copied


def reconstruct_command(runs: list[Run]) -> str:
    """``python -m laplace_lab.train -m k=v1,v2 ...`` from the jobs' overrides."""
    values: dict[str, list[str]] = {}
    for run in runs:
        for key, value in run.overrides.items():
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    return " ".join([ENTRY, "-m", *(shlex.quote(f"{k}={','.join(v)}") for k, v in values.items())])


def provenance(runs: list[Run], sweep_dirs: list[Path], seed_keys: tuple[str, ...],
               launches: dict[Path, dict[str, Any]] | None = None, problems: list[str] = (),
               preset: str | None = None, launch_issues: list[str] = ()) -> dict[str, Any]:
    """Commit(s), command(s), seeds, hardware and wall time of the runs (what the table header
    shows; ``job_commands`` maps each job folder with a launch record to its launch's command);
    paths relative to the launch folder or the repository, never absolute. ``problems``:
    why the jobs are not one clean commit containing the preset; ``launch_issues``: why they are
    not one launch (jobs of one clean commit may come from several commands)."""
    launches = launches if launches is not None else run_launches(runs, sweep_dirs)
    commits = sorted({run_commit(r) for r in runs})
    dirty = sorted({str((r.status.get("git") or {}).get("dirty")) for r in runs if r.status.get("git")})
    here = [REPO_ROOT, Path.cwd()]
    job_commands = {r.path: launch_command(launches[r.path], here) for r in runs if r.path in launches}
    commands = list(dict.fromkeys(job_commands.values()))
    command_source = "recorded at launch"
    if not commands:
        commands, command_source = [portable_command(reconstruct_command(runs), here)], \
            "reconstructed from the jobs' overrides"
    hw = {json.dumps(r.status["hardware"], sort_keys=True) for r in runs if r.status.get("hardware")}
    hardware_source = "recorded by the jobs"
    if not hw:
        hw, hardware_source = {json.dumps(hardware(), sort_keys=True)}, "of the aggregating machine; the runs record none"
    walls = [job_seconds(r) for r in runs]
    sources = {s for _, s in walls}
    wall_source = ("per-job wall clock of run() from status.json: training + evaluation" if sources == {"job"}
                   else "per-job time/fit_s from metrics.json (training only)" if sources == {"fit"}
                   else "status.json wall clock where recorded, else time/fit_s (training only)")
    if any("checkpoint/resumed_fit_s" in r.metrics for r in runs):
        wall_source += ("; a job resumed from a checkpoint (checkpoint.resume_from=last) adds the training "
                        "seconds of its earlier launches (checkpoint/resumed_fit_s)")
    seeds = {k: sorted({r.value(k) for r in runs if r.value(k) != MISSING}, key=_natural) for k in seed_keys}
    finite = [w for w, _ in walls if math.isfinite(w)]
    return {
        "commits": commits, "dirty": dirty, "problems": list(problems), "launch_issues": list(launch_issues),
        "preset": preset,
        "commands": commands, "command_source": command_source, "job_commands": job_commands,
        "seeds": {k: v for k, v in seeds.items() if v}, "hardware": [json.loads(h) for h in sorted(hw)],
        "hardware_source": hardware_source,
        "wall_time_s": {"sum": math.fsum(finite), "max": max(finite, default=math.nan), "jobs": len(finite),
                        "source": wall_source},
        "sweep_dirs": [portable_path(d, here) for d in sweep_dirs], "n_runs": len(runs),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def launch_command(launch: dict[str, Any], here: list[Path]) -> str:
    """A launch record's command with its paths made portable (relative to its cwd or ``here``)."""
    return portable_command(launch["command"], [Path(launch.get("cwd") or "."), *here])


def job_seconds(run: Run) -> tuple[float, str]:
    """(seconds, source) of one job (``sweeps.status.job_seconds``: earlier launches included)."""
    return status_job_seconds(run.status, run.metrics)


def _natural(text: str) -> tuple:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else str(x)
    return f"{x:.1f}" if abs(x) >= 1000 else f"{x:.4f}"


def _hardware_text(h: dict[str, Any]) -> str:
    device = h.get("cuda_device") or "CPU only"
    return f"{h.get('platform')}, {h.get('cpu_count')} CPUs, torch {h.get('torch')}, device: {device}"


def provenance_lines(name: str, prov: dict[str, Any]) -> list[str]:
    w = prov["wall_time_s"]
    seeds = "; ".join(f"{k}: {', '.join(v)}" for k, v in prov["seeds"].items()) or "none"
    launch_issues = prov["launch_issues"]
    if prov["problems"]:
        commit = [f"commit: {', '.join(prov['commits'])} (dirty: {', '.join(prov['dirty']) or 'unknown'})",
                  "provenance: NOT ONE CLEAN COMMIT (the commit of each row is in its `commits` column): "
                  + "; ".join(prov["problems"] + launch_issues)]
    else:
        contains = f"; contains {preset_files(prov['preset'])[0]}" if prov.get("preset") else ""
        commit = [f"commit: {', '.join(prov['commits'])} (dirty: False)",
                  f"clean at job start: no modified, untracked or ignored package files{contains}"]
        if launch_issues:
            commit.append("launches: one clean commit, several launch commands (written with --allow-mixed-launches): "
                          + "; ".join(launch_issues))
    commands = prov["commands"]
    command_lines = ([f"command ({prov['command_source']}): {c}" for c in commands]
                     if len(commands) <= HEADER_LIST_MAX else
                     [f"commands ({prov['command_source']}): {len(commands)} different; each job's is in the "
                      f"`command` column of {name}.jobs.csv"])
    return [
        f"table: {name}",
        *commit,
        *command_lines,
        f"seeds: {seeds}",
        *(f"hardware ({prov['hardware_source']}): {_hardware_text(h)}" for h in prov["hardware"]),
        f"wall time: sum {w['sum']:.1f} s, max {w['max']:.1f} s over {w['jobs']} jobs ({w['source']})",
        f"runs: {prov['n_runs']} finished jobs in {_folders_text(prov['sweep_dirs'])}; generated {prov['generated']}",
    ]


def _folders_text(folders: list[str]) -> str:
    """The sweep folders, or past ``HEADER_LIST_MAX`` of them their count and common parent."""
    parent = os.path.commonpath(folders) if len(folders) > HEADER_LIST_MAX else ""
    if not parent or parent in folders:
        return ", ".join(folders)
    return f"{len(folders)} sweep folders under {parent} (each job's folder: the `job` column of the jobs CSV)"


def _cell(row: dict[str, Any], m: str) -> str:
    mean, se, n = row[m]
    bad = row["nonfinite"].get(m, 0)
    cell = f"{_fmt(mean)} ± {_fmt(se)}" if n > 1 else (_fmt(mean) if n == 1 else MISSING)
    notes = ([f"n={n}"] if 0 < n != row["n"] else []) + ([f"{bad} non-finite left out"] if bad else [])
    return cell + (f" ({'; '.join(notes)})" if notes else "")


def _relative(path: Path, sweep_dirs: list[Path]) -> str:
    for d in sweep_dirs:
        try:
            return str(Path(d.name) / path.relative_to(d))
        except ValueError:
            continue
    return portable_path(path, [REPO_ROOT, Path.cwd()])


def problems_markdown(loaded: Loaded, nonfinite: list[tuple[Path, str, float]], sweep_dirs: list[Path]) -> list[str]:
    """The sections listing non-finite values and unreadable job folders (none when all is well)."""
    lines = []
    if nonfinite:
        lines += ["", "## Non-finite values (left out of the cells above)", ""]
        lines += [f"- `{_relative(p, sweep_dirs)}`: {_md(m)} = {v}" for p, m, v in nonfinite]
    if loaded.unreadable:
        lines += ["", "## Job folders left out (unreadable files)", ""]
        lines += [f"- `{_relative(p, sweep_dirs)}`: {why}" for p, why in loaded.unreadable]
    if loaded.left_out:
        lines += ["", "## Jobs left out (not finished)", ""]
        lines += [f"- `{_relative(p, sweep_dirs)}`: {_md(why)}" for p, why in loaded.left_out]
    return lines


def absent_markdown(absent: list[str]) -> list[str]:
    """The section naming the asked-for metrics that no run has (none when there are none)."""
    if not absent:
        return []
    return ["", "## Metrics left out (in no run's metrics.json)", "", ", ".join(f"`{m}`" for m in absent)]


def to_markdown(name: str, rows: list[dict[str, Any]], group_by: list[str], metrics: list[str],
                prov: dict[str, Any]) -> str:
    """The header and the results table (the sections below it come from ``aggregate``)."""
    head = [f"# {name}", ""] + [f"- {line}" for line in provenance_lines(name, prov)[1:]]
    head += ["", "Cells: mean ± standard error over the group's runs (n); (n=k) where a metric has fewer runs"
             " (NaN / inf values are left out and counted).", ""]
    mixed = bool(prov["problems"])
    columns = [*group_by, "n", *(["commits"] if mixed else []), *metrics]
    lines = ["| " + " | ".join(_md(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row[k]) for k in group_by] + [str(row["n"])] + ([row["commits"]] if mixed else [])
        cells += [_cell(row, m) for m in metrics]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    return "\n".join(head + lines) + "\n"


MD_ESCAPES = {"\\": "\\\\", "|": "\\|", "`": "\\`", "&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _md(text: str) -> str:
    """``text`` for a markdown table cell: ``|`` cannot split the table and HTML shows as text."""
    return "".join(MD_ESCAPES.get(c, c) for c in str(text))


def to_csv(name: str, rows: list[dict[str, Any]], group_by: list[str], metrics: list[str],
           prov: dict[str, Any]) -> str:
    buf = io.StringIO()
    for line in provenance_lines(name, prov):
        buf.write(f"# {line}\n")
    writer = csv.writer(buf, lineterminator="\n")
    mixed = ["commits"] if prov["problems"] else []
    writer.writerow([*group_by, "n", "seeds", *mixed,
                     *(f"{m}{s}" for m in metrics for s in (" mean", " se", " n", " nonfinite"))])
    for row in rows:
        stats = [v for m in metrics for v in (repr(row[m][0]), repr(row[m][1]), row[m][2], row["nonfinite"][m])]
        writer.writerow([*(row[k] for k in group_by), row["n"], row["seeds"], *(row[k] for k in mixed), *stats])
    return buf.getvalue()


def jobs_csv(name: str, runs: list[Run], group_by: list[str], metrics: list[str], prov: dict[str, Any],
             sweep_dirs: list[Path]) -> str:
    """One row per job: folder, group-by values, overrides, the command of the launch that ran it
    (empty where none was recorded), commit, dirty, wall time, every metric."""
    buf = io.StringIO()
    for line in provenance_lines(name, prov):
        buf.write(f"# {line}\n")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["job", *group_by, "overrides", "command", "commit", "dirty", "wall_s", *metrics])
    here = [REPO_ROOT, Path.cwd()]
    for run in sorted(runs, key=lambda r: str(r.path)):
        git = run.status.get("git") or {}
        overrides = " ".join(portable_command(f"{k}={v}", here) for k, v in run.overrides.items())
        seconds, source = job_seconds(run)
        writer.writerow([_relative(run.path, sweep_dirs), *(run.value(k) for k in group_by), overrides,
                         prov["job_commands"].get(run.path, ""),
                         run_commit(run), git.get("dirty", ""), seconds if source == "job" else "",
                         *(repr(run.metrics[m]) if m in run.metrics else "" for m in metrics)])
    return buf.getvalue()


def _references(preset: str | None, reference: str | Path | None) -> list[dict[str, Any]] | None:
    """The validated reference files to judge the table with; None without preset or file."""
    if reference is not None:
        loaded = ref.load_reference(reference)
        if preset and preset not in loaded["presets"]:
            raise ref.ReferenceFileError(f"{reference}: field `preset` names {list(loaded['presets'])}, but the "
                                         f"table is for preset {preset!r}")
        return [loaded]
    return ref.find_references(preset, EXPERIMENTS_DIR) if preset else None


def reference_markdown(files: list[dict[str, Any]], preset: str | None, rows: list[dict[str, Any]],
                       group_by: list[str]) -> list[str]:
    """The "Reference numbers" section (verdicts), or a line saying that no file names the preset."""
    if not files:
        return ["", "## Reference numbers", "",
                f"No `experiments/*/reference*.yaml` names preset `{preset}`: no verdicts."]
    entries = [e for f in files for e in f["references"]]
    shown = [portable_path(f["path"], [EXPERIMENTS_DIR.parent, Path.cwd()]) for f in files]
    return ref.to_markdown(ref.verdicts(entries, rows, group_by), shown)


def _duplicates_message(dups: list[list[Run]], sweep_dirs: list[Path]) -> str:
    sets = "; ".join("[" + ", ".join(_relative(r.path, sweep_dirs) for r in group) + "]" for group in dups)
    return (f"{len(dups)} job(s) appear more than once (same overrides, less run-only keys such as "
            f"torch_num_threads, logger.*, paths.*): {sets}. Each job must count once: delete the extra folders "
            "or aggregate their sweeps separately.")


def aggregate(sweep_dirs: list[str | Path], name: str, spec: TableSpec | None = None,
              results_dir: str | Path | None = None, preset: str | None = None,
              reference: str | Path | None = None, commit_results: bool = False,
              admission: Admission | None = None) -> list[Path]:
    """Write ``<name>.md``, ``<name>.csv`` and ``<name>.jobs.csv`` from the finished runs; returns them.

    ``spec`` (``table_spec.TableSpec``, default ``TableSpec()``): metrics, group-by and seed keys,
    ``figures`` (names of ``figures/<fig>.png`` to copy, from each group's first seed, into
    ``<results_dir>/<name>_figures/``), ``model_selection`` (a ranking section) and
    ``absent_metrics`` (``"error"`` or ``"omit"``: a partial sweep, e.g. one data set of a preset
    whose metrics cover two). ``results_dir``: default the first sweep folder; ``commit_results``
    writes into ``COMMITTED_RESULTS`` (``results/``), the only way to write there, and needs
    ``preset``: it writes that preset's own table (``check_commit_name``). ``preset`` /
    ``reference``: the reference files whose verdicts make the "Reference numbers" section, and the
    preset the jobs' commit must contain. ``admission`` (``table_spec.Admission``, default
    ``Admission()``): raises ``ProvenanceError`` (before writing) when the jobs are not from one
    clean commit (unless ``allow_mixed``) or one launch command (unless ``allow_mixed_launches``),
    or when a job appears twice; ``launch_id``: only that launch's jobs; ``allow_smaller``: let
    ``commit_results`` replace a committed table by one with fewer jobs, seeds or rows
    (``table_commit``). The three files are rendered first, then become visible together
    (``io.atomic.write_texts_together``: a write cut between its renames is completed by the next
    reader, ``table_commit.settled_table``); figures of a requested name that this table no longer
    has are removed from ``<name>_figures/``.
    """
    spec = TableSpec() if spec is None else spec
    admission = Admission() if admission is None else admission
    metrics, group_by, figures, absent_metrics = spec.metrics, spec.group_by, spec.figures, spec.absent_metrics
    model_selection = spec.model_selection
    if absent_metrics not in ABSENT_METRICS:
        raise ValueError(f"absent_metrics={absent_metrics!r}; allowed: {list(ABSENT_METRICS)}")
    if model_selection is not None:
        model_selection = validate_spec(model_selection)
    check_name(name, TABLE_NAME)  # <name>.md: a name, never a path
    dirs = [Path(d) for d in sweep_dirs]
    if commit_results and results_dir is not None:
        raise ValueError("give either results_dir (--results-dir) or commit_results (--commit-results), not both")
    if commit_results and is_smoke_choice(preset):
        raise ProvenanceError(f"refusing to commit table {name!r}: --preset {preset!r} is a smoke variant "
                              "(experiment=<preset>/smoke): one seed and a few epochs, not a reproduction; "
                              "commit the tables of the preset's own sweep")
    if commit_results:  # the preset's own table only, as the command line requires
        check_commit_name(preset, preset_spec(preset) if preset else {}, name)
    out = COMMITTED_RESULTS if commit_results else Path(results_dir) if results_dir is not None else dirs[0]
    if not commit_results and out.resolve().is_relative_to(COMMITTED_RESULTS.resolve()):
        raise ValueError(f"{out} holds the committed tables: write there only with --commit-results "
                         "(commit_results=True), into results/ itself; by default tables go to the sweep folder")
    smoke = is_smoke_choice(preset)
    preset = preset.rsplit("/", 1)[0] if smoke else preset  # a smoke variant is judged by its preset's files
    references = _references(preset, reference)
    seeds = tuple(DEFAULT_SEED_KEYS if spec.seed_keys is None else spec.seed_keys)
    loaded = load_runs(dirs, admission.launch_id)
    runs = loaded.runs
    if not runs:
        raise ValueError(f"no finished runs (metrics.json with {STATUS_FILE} state 'finished') under "
                         f"{', '.join(map(str, dirs))}"
                         + "".join(f"; left out {p}: {why}" for p, why in loaded.unreadable))
    smoke_runs = [r for r in runs if is_smoke_choice(r.choices.get("experiment"))]
    if commit_results and smoke_runs:  # a smoke --preset was refused above, before any job was read
        example = _relative(smoke_runs[0].path, dirs)
        raise ProvenanceError(f"refusing to commit table {name!r}: {len(smoke_runs)} job(s) ran a smoke "
                              f"variant (experiment=<preset>/smoke, e.g. {example}): one seed and a few epochs, "
                              "not a reproduction; commit the tables of the preset's own sweep")
    dups = duplicate_jobs(runs)
    if dups:
        raise ProvenanceError(_duplicates_message(dups, dirs))
    launches = run_launches(runs, dirs)
    commit_issues = commit_problems(runs, preset, label=lambda path: _relative(path, dirs))
    launch_issues = launch_problems(runs, launches)
    if commit_issues and not admission.allow_mixed:
        raise ProvenanceError(f"refusing to write table {name!r}: " + "; ".join(commit_issues)
                              + ". Rerun the jobs from one clean commit (a relaunch skips finished jobs: launch into "
                              "a new folder with hydra.sweep.dir=..., or delete the jobs' folders first), or pass "
                              "--allow-mixed (allow_mixed=True): the table then names the commit of every row.")
    if launch_issues and not admission.allow_mixed_launches:
        raise ProvenanceError(f"refusing to write table {name!r}: " + "; ".join(launch_issues)
                              + ". Aggregate each launch's sweep folder separately, or pass --allow-mixed-launches.")
    keys = list(group_by) if group_by is not None else default_group_by(runs, seeds)
    names = list(metrics) if metrics else default_metrics(runs)
    selection_names = [model_selection["score"], *model_selection["targets"]] if model_selection else []
    add_derived([*names, *selection_names], [r.metrics for r in runs], [_relative(r.path, dirs) for r in runs])
    unknown = [m for m in names if not any(m in r.metrics for r in runs)]
    if unknown and absent_metrics == "error":
        raise ValueError(f"metrics {unknown} are in no run's metrics.json; allowed: {default_metrics(runs)}")
    if unknown:
        log.warning("Metrics in no run's metrics.json, left out of table %s: %s", name, unknown)
        names = [m for m in names if m not in unknown]
    rows = group_rows(runs, keys, names, seeds)
    verdict_lines = reference_markdown(references, preset, rows, keys) if references is not None else []
    nonfinite = nonfinite_values(runs, names)
    for path, metric, value in nonfinite:
        log.warning("Non-finite %s = %s in %s: left out of table %s", metric, value, path, name)
    prov = provenance(runs, dirs, seeds, launches, commit_issues, preset, launch_issues)
    if commit_results:  # before anything is written
        shape = TableShape(jobs=len(runs), seeds=seed_set(r["seeds"] for r in rows), columns=tuple(keys),
                           rows=frozenset(tuple(str(r[k]) for k in keys) for r in rows))
        check_replacement(out, name, shape, admission.allow_smaller)
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path, jobs_path = settled_table(out, name)
    copied = copy_figures(runs, keys, list(figures or ()), seeds, out / f"{name}_figures")
    remove_stale_figures(out / f"{name}_figures", list(figures or ()), [p for _, _, p in copied])
    sections = [*smoke_markdown(smoke_runs, preset), *verdict_lines, *problems_markdown(loaded, nonfinite, dirs),
                *absent_markdown(unknown)]
    if model_selection is not None:
        sections += selection_markdown(rank_candidates(runs, model_selection, seeds), model_selection)
    if copied:
        sections += ["", "## Figures (first seed of each group; all groups: drawn from every seed)", ""]
        sections += [f"![{label}: {fig}]({p.parent.name}/{p.name})" for label, fig, p in copied]
    text = to_markdown(name, rows, keys, names, prov) + ("\n".join(sections) + "\n" if sections else "")
    contents = {md: text, csv_path: to_csv(name, rows, keys, names, prov),
                jobs_path: jobs_csv(name, runs, keys, names, prov, dirs)}
    write_texts_together(contents, table_journal(out, name))  # rendered first, then visible together
    return [md, csv_path, jobs_path]


def smoke_markdown(smoke_runs: list[Run], preset: str | None) -> list[str]:
    """A warning section for a table with jobs of a smoke variant (``experiment=<preset>/smoke``)."""
    if not smoke_runs:
        return []
    return ["", "## SMOKE RUN: not a reproduction", "",
            f"{len(smoke_runs)} job(s) ran `experiment={preset or '<preset>'}/smoke` (one seed, a few epochs): "
            "they show that the preset runs end to end; the numbers and verdicts below say nothing about the "
            "paper. `--commit-results` refuses these jobs."]


def remove_stale_figures(folder: Path, figures: list[str], written: list[Path]) -> list[Path]:
    """Remove the figures of the requested names (``<label>__<fig>.png``, ``<fig>.png``) in ``folder``
    that this table did not write: rows it no longer has. Returns them."""
    if not folder.is_dir() or not figures:
        return []
    keep = {p.resolve() for p in written}
    stale = [p for p in sorted(folder.glob("*.png")) if p.resolve() not in keep
             and (p.stem in figures or any(p.stem.endswith(f"__{fig}") for fig in figures))]
    for path in stale:
        path.unlink()
        log.warning("Removed %s: a figure of a row this table no longer has", path)
    return stale


def aggregate_sweep(sweep_dir: str | Path, spec: dict[str, Any], launch_id: str | None = None,
                    preset: str | None = None) -> list[Path]:
    """The end-of-multirun table: ``aggregate`` on the jobs of launch ``launch_id``, written into
    the sweep folder (a relative ``spec['results_dir']`` is taken under it). Mixed provenance is
    stated in the header rather than refused; ``tables --commit-results`` is the strict path."""
    spec = dict(spec)
    results_dir = spec.pop("results_dir", None)
    name = spec.pop("name")
    out = Path(sweep_dir) if results_dir is None else inside(results_dir, sweep_dir, "aggregate.results_dir")
    return aggregate([sweep_dir], name, TableSpec(**spec, absent_metrics="omit"), results_dir=out, preset=preset,
                     admission=Admission(launch_id=launch_id, allow_mixed=True, allow_mixed_launches=True))


def preset_file(preset: str) -> Path:
    """``experiments/<preset>/preset.yaml``; a ValueError listing the presets when there is none."""
    try:
        return preset_path(preset, EXPERIMENTS_DIR)
    except ValueError:
        raise ValueError(f"--preset {preset!r} is not a preset; allowed: {preset_names(EXPERIMENTS_DIR)}") from None


def preset_spec(preset: str) -> dict[str, Any]:
    """The ``aggregate`` block of ``experiments/<preset>/preset.yaml`` (what its multirun uses)."""
    from omegaconf import OmegaConf

    path = preset_file(preset)
    spec = OmegaConf.select(OmegaConf.load(path), "aggregate")
    if spec is None:
        raise ValueError(f"--preset {preset!r} has no `aggregate` block in {path}")
    return OmegaConf.to_container(spec, resolve=False)


def default_sweep_dir(preset: str) -> Path:
    """``outputs/<experiment_name>/multirun``: where ``python -m laplace_lab.train experiment=<preset>``
    puts its jobs with the default ``paths.output_root``."""
    from omegaconf import OmegaConf

    name = OmegaConf.select(OmegaConf.load(preset_file(preset)), "experiment_name", default=preset)
    return Path("outputs") / str(name) / "multirun"


def check_commit_name(preset: str | None, spec: dict[str, Any], name: str) -> None:
    """``--commit-results`` writes a preset's own table: ``results/<its aggregate.name>.*``, or a
    variant of it (``<that name>_<suffix>``, e.g. ``redux_mnist_authors_eval``); ``ValueError`` otherwise."""
    if not preset:
        raise ValueError("--commit-results needs --preset: results/ holds the presets' own tables "
                         "(results/<the preset's aggregate.name>.md/.csv/.jobs.csv)")
    own = spec["name"]
    if name != own and not str(name).startswith(f"{own}_"):
        raise ValueError(f"--name {name!r} with --commit-results: preset {preset!r} writes results/{own}.* or a "
                         f"variant results/{own}_<suffix>.*; allowed: --name {own} or {own}_<suffix>")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m laplace_lab.reporting.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dirs", nargs="*", type=Path,
                   help="multirun folder(s), e.g. outputs/<exp>/multirun (default with --preset: "
                        "outputs/<its experiment_name>/multirun)")
    p.add_argument("--preset", default=None,
                   help="take name, metrics, group-by, seed keys, figures and model selection from the "
                        "`aggregate` block of experiments/<preset>/preset.yaml (explicit options win); adds the "
                        "verdicts of experiments/*/reference*.yaml files of the preset; the jobs' commit must "
                        "contain the preset")
    p.add_argument("--reference", type=Path, default=None,
                   help="a reference.yaml to judge the table with (instead of the preset's)")
    p.add_argument("--name", default=None, help="table name: writes <name>.md, .csv and .jobs.csv")
    p.add_argument("--metrics", nargs="+", default=None, help="metric keys (default: all but time/*)")
    p.add_argument("--group-by", nargs="+", default=None, help="method keys (default: the overrides less seeds)")
    p.add_argument("--seed-keys", nargs="+", default=None, help=f"replicate keys (default: {list(DEFAULT_SEED_KEYS)})")
    p.add_argument("--results-dir", default=None, type=Path, help="output folder (default: the first sweep folder)")
    p.add_argument("--commit-results", action="store_true",
                   help="write into the repository's results/ (the committed tables)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="write although the jobs are not from one clean commit containing the preset (the table "
                        "names the commit of every row)")
    p.add_argument("--allow-mixed-launches", action="store_true",
                   help="write although the jobs were launched by different commands")
    p.add_argument("--allow-smaller", action="store_true",
                   help="with --commit-results: replace a committed table by one with fewer jobs, seeds or rows")
    p.add_argument("--figures", nargs="+", default=None, help="figure names (figures/<name>.png) to copy")
    args = p.parse_args(argv)
    try:
        spec = preset_spec(args.preset) if args.preset else {}
        name = args.name if args.name is not None else spec.get("name")
        if name is None:
            p.error("--name is required unless --preset gives one")
        check_name(name, TABLE_NAME)
        if not args.sweep_dirs and not args.preset:
            p.error("give the multirun folder(s), or --preset for its default folder")
        sweep_dirs = args.sweep_dirs or [default_sweep_dir(args.preset)]
        table = TableSpec(metrics=args.metrics or spec.get("metrics"), group_by=args.group_by or spec.get("group_by"),
                          seed_keys=args.seed_keys or spec.get("seed_keys") or list(DEFAULT_SEED_KEYS),
                          figures=args.figures or spec.get("figures"), model_selection=spec.get("model_selection"))
        admission = Admission(allow_mixed=args.allow_mixed, allow_mixed_launches=args.allow_mixed_launches,
                              allow_smaller=args.allow_smaller)
        paths = aggregate(sweep_dirs, name, table, args.results_dir, preset=args.preset, reference=args.reference,
                          commit_results=args.commit_results, admission=admission)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"python -m laplace_lab.reporting.tables: error: {err}")
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
