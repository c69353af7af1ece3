"""The preset table of the top README, generated from the preset folders (``experiments/<preset>/``)
and the committed tables: one row per preset, between the markers ``BEGIN`` and ``END``.

A row: the preset (linked to its folder), the first ``# `` heading of its ``README.md`` (what it
reproduces), its jobs, its cost, its smoke command and its verdicts. Jobs and cost come from the
committed ``results/<aggregate.name>.jobs.csv`` (one row per job, ``wall_s``: each job's measured wall
clock): the total over the jobs, which ran one after another on one machine (the longest job is in
the table's header); a preset without a committed table shows the size of its sweep and "not run". The smoke
cell is ``<preset>/smoke`` (``experiment=<preset>/smoke``) where the folder has a ``smoke.yaml``,
with the time its ``# Measured:`` comment line records (none where not measured). The verdicts are
``results_summary.short_verdict`` of the same judgement as ``results/README.md``.

Written by ``python -m laplace_lab.reporting.results_summary`` (``--check`` fails when stale).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from laplace_lab.config import presets
from laplace_lab.reporting.table_commit import settled_table

BEGIN = "<!-- preset table: generated from experiments/<preset>/ by results_summary; do not edit -->"
END = "<!-- end of the preset table -->"
HEADER = ("| preset (write-up) | reproduces | jobs | cost, all jobs | smoke (time) | "
          "verdicts ([results/README.md](results/README.md)) |")
RULE = "|---|---|---|---|---|---|"
MEASURED = "# Measured:"


class PresetFolderError(ValueError):
    """A preset folder that lacks what the table reads; the message names the file."""


@dataclass
class Preset:
    """What the table shows of one preset folder."""

    name: str
    title: str           # the first "# " heading of its README.md
    table: str           # its aggregate.name: results/<table>.*
    sweep_jobs: int      # the size of its sweep (the product of hydra.sweeper.params)
    smoke: str | None    # the smoke cell, None without smoke.yaml


def duration(seconds: float) -> str:
    """``54 s``, ``63 min``, ``8.4 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def readme_title(folder: Path) -> str:
    """The first ``# `` heading of ``<folder>/README.md``."""
    readme = folder / presets.README_FILE
    if not readme.is_file():
        raise PresetFolderError(f"{readme}: missing; a preset folder holds preset.yaml, reference.yaml and "
                                "README.md (its first '# ' heading names what it reproduces)")
    for line in readme.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise PresetFolderError(f"{readme}: has no '# ' heading (the preset table's 'reproduces' cell)")


def smoke_cell(folder: Path) -> str | None:
    """``<preset>/smoke`` and the time of its ``# Measured:`` line, None without ``smoke.yaml``."""
    path = folder / presets.SMOKE_FILE
    if not path.is_file():
        return None
    measured = [line[len(MEASURED):].strip() for line in path.read_text().splitlines() if line.startswith(MEASURED)]
    return f"`{folder.name}/smoke`" + (f" ({measured[0]})" if measured else "")


def sweep_size(params: dict) -> int:
    """The number of jobs of a sweep: the product of the number of values of each parameter."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return math.prod(len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1 for o in parsed)


def load_presets(experiments_dir: Path = presets.EXPERIMENTS_DIR) -> list[Preset]:
    """Every preset folder under ``experiments_dir``, composed as ``experiment=<preset>`` would be."""
    from hydra import compose, initialize_config_dir

    from laplace_lab.config import CONF_DIR

    experiments_dir = Path(experiments_dir).resolve()
    out = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in presets.preset_names(experiments_dir):
            cfg = compose("train", overrides=[f"hydra.searchpath=[{presets.SCHEME}://{experiments_dir}]",
                                              f"experiment={name}"], return_hydra_config=True)
            params = dict(cfg.hydra.sweeper.params or {})
            table = cfg.get("aggregate", {}).get("name") if cfg.get("aggregate") else None
            out.append(Preset(name, readme_title(experiments_dir / name), str(table or name), sweep_size(params),
                              smoke_cell(experiments_dir / name)))
    return out


def job_seconds(jobs_csv: Path) -> list[float]:
    """The ``wall_s`` of every job of a committed ``<table>.jobs.csv`` (empty cells left out)."""
    lines = [line for line in jobs_csv.read_text().splitlines() if not line.startswith("#")]
    return [float(row["wall_s"]) for row in csv.DictReader(lines) if row.get("wall_s")]


def row(preset: Preset, results_dir: Path, verdicts: dict[str, str]) -> str:
    """One markdown row (``verdicts``: table name -> its short verdict)."""
    jobs_csv = settled_table(results_dir, preset.table)[2]
    if jobs_csv.is_file():
        seconds = job_seconds(jobs_csv)
        lines = [line for line in jobs_csv.read_text().splitlines() if not line.startswith("#")]
        jobs = str(len(lines) - 1)
        cost = duration(sum(seconds)) if seconds else "not recorded"
    else:
        jobs, cost = str(preset.sweep_jobs), "not run"
    cells = [f"[`{preset.name}`](experiments/{preset.name}/)", preset.title, jobs, cost, preset.smoke or "-",
             verdicts.get(preset.table, "-")]
    return "| " + " | ".join(cells) + " |"


def render(found: list[Preset], results_dir: Path, verdicts: dict[str, str]) -> list[str]:
    """The table, markers included."""
    return [BEGIN, HEADER, RULE, *(row(p, Path(results_dir), verdicts) for p in found), END]


def replace_table(text: str, table: list[str], where: str = "README.md") -> str:
    """``text`` with the lines from ``BEGIN`` to ``END`` replaced by ``table``."""
    lines = text.splitlines()
    if BEGIN not in lines or END not in lines:
        raise PresetFolderError(f"{where}: lacks the preset table's markers {BEGIN!r} ... {END!r}")
    start, end = lines.index(BEGIN), lines.index(END)
    return "\n".join(lines[:start] + table + lines[end + 1:]) + "\n"
