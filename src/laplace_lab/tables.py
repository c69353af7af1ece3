"""Aggregate the finished jobs of multiruns into ``results/<name>.md`` and ``results/<name>.csv``.

    python -m laplace_lab.tables outputs/<experiment>/multirun --name <name> \
        [--metrics test/map/acc test/la/nll] [--group-by model curvature] [--seed-keys seed data.split] \
        [--figures reliability] [--results-dir results]

Every job folder under the given multirun folders with a ``metrics.json`` (and, when it has a
``status.json`` marker, state ``finished``) is one run. Runs are grouped by the method keys: by
default every key of the jobs' ``.hydra/overrides.yaml`` except the seed keys (``seed``,
``data.split``) and the keys Hydra keeps out of folder names (``exclude_keys``). A group-by key is
looked up in the job's overrides, then its config-group choices (``model``, ``curvature``, ...),
then its resolved config (``curvature.hessian_structure``). Each cell is mean +- standard error
(sample std / sqrt(n)) over the group's runs, with n. Both files carry the provenance: git
commit(s) and dirty flag at launch, the command, the seeds, the hardware, the wall time. The CSV
carries it as leading ``# `` lines (``pandas.read_csv(path, comment="#")``).

``--figures`` copies ``figures/<fig>.png`` of each group's first seed next to the table.
Also called by the ``SweepSummary`` callback at the end of a multirun when the config has a root
``aggregate: {name, metrics, group_by, seed_keys, results_dir, figures}`` (or
``hydra.callbacks.sweep_summary.aggregate``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import shlex
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from laplace_lab.model_selection import rank_candidates, validate_spec
from laplace_lab.model_selection import to_markdown as selection_markdown
from laplace_lab.sweeps.status import (
    ENTRY,
    STATUS_FILE,
    git_state,
    hardware,
    read_launches,
    read_status,
)

DEFAULT_SEED_KEYS = ("seed", "data.split")
MISSING = "-"


@dataclass
class Run:
    """One finished job: its folder, metrics, overrides, config-group choices and resolved config."""

    path: Path
    metrics: dict[str, float]
    overrides: dict[str, str] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    exclude_keys: tuple[str, ...] = ()

    def value(self, key: str) -> str:
        """The run's value of ``key`` as text (overrides, then group choices, then config)."""
        if key in self.overrides:
            return self.overrides[key]
        if key in self.choices:
            return str(self.choices[key])
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return MISSING if isinstance(node, dict) else _text(node)


def _text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, bool)) or value is None else str(value)


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


def load_run(job_dir: Path) -> Run | None:
    """The run in ``job_dir``, or None when it has no finished run."""
    status = read_status(job_dir)
    if status is not None and status.get("state") != "finished":
        return None
    try:
        metrics = json.loads((job_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    hydra_cfg = (_load_yaml(job_dir / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
    exclude = (((hydra_cfg.get("job") or {}).get("config") or {}).get("override_dirname") or {}).get("exclude_keys")
    return Run(
        path=job_dir,
        metrics={k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
        overrides=parse_overrides(_load_yaml(job_dir / ".hydra" / "overrides.yaml") or []),
        choices=dict((hydra_cfg.get("runtime") or {}).get("choices") or {}),
        config=_load_yaml(job_dir / "config_resolved.yaml") or {},
        status=status or {},
        exclude_keys=tuple(exclude or ()),
    )


def load_runs(sweep_dirs: list[Path]) -> list[Run]:
    runs = []
    for sweep_dir in sweep_dirs:
        if not Path(sweep_dir).is_dir():
            raise FileNotFoundError(f"multirun folder {sweep_dir} does not exist")
        for metrics_file in sorted(Path(sweep_dir).rglob("metrics.json")):
            run = load_run(metrics_file.parent)
            if run is not None:
                runs.append(run)
    return runs


def mean_se(values: list[float]) -> tuple[float, float, int]:
    """Mean, standard error (sample std / sqrt(n); NaN for n < 2) and n."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = math.fsum(values) / n
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
    return mean, se, n


def default_group_by(runs: list[Run], seed_keys: tuple[str, ...]) -> list[str]:
    """Every override key of the runs, in first-seen order, less seed and excluded keys."""
    keys: list[str] = []
    for run in runs:
        for key in run.overrides:
            if key not in keys and key not in seed_keys and key not in run.exclude_keys:
                keys.append(key)
    return keys


def default_metrics(runs: list[Run]) -> list[str]:
    """Every metric any run reports, sorted, less the ``time/*`` ones."""
    return sorted({k for run in runs for k in run.metrics if not k.startswith("time/")})


def group_runs(runs: list[Run], group_by: list[str]) -> dict[tuple[str, ...], list[Run]]:
    """Runs by their group-by values (first-seen order)."""
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.value(k) for k in group_by), []).append(run)
    return groups


def group_rows(runs: list[Run], group_by: list[str], metrics: list[str],
               seed_keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per group: the key values, n, the seeds, and ``<metric>`` -> (mean, se, n)."""
    rows = []
    for key, members in group_runs(runs, group_by).items():
        row: dict[str, Any] = dict(zip(group_by, key))
        row["n"] = len(members)
        seeds = {" ".join(f"{s}={r.value(s)}" for s in seed_keys if r.value(s) != MISSING) for r in members}
        row["seeds"] = ", ".join(sorted(seeds, key=_natural))
        for m in metrics:
            row[m] = mean_se([r.metrics[m] for r in members if m in r.metrics])
        rows.append(row)
    return rows


def copy_figures(runs: list[Run], group_by: list[str], figures: list[str], seed_keys: tuple[str, ...],
                 out_dir: Path) -> list[tuple[str, str, Path]]:
    """Copy ``figures/<fig>.png`` of each group's first seed to ``out_dir``; (group, fig, path) each."""
    copied = []
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


def provenance(runs: list[Run], sweep_dirs: list[Path], seed_keys: tuple[str, ...]) -> dict[str, Any]:
    """Commit(s), command(s), seeds, hardware and wall time of the runs (what the table header shows)."""
    commits = sorted({(r.status.get("git") or {}).get("commit") or "unknown" for r in runs})
    dirty = sorted({str((r.status.get("git") or {}).get("dirty")) for r in runs if r.status.get("git")})
    if not any(r.status.get("git") for r in runs):  # runs without markers: the repo as it is now
        now = git_state()
        commits, dirty = [f"{now['commit']} (at aggregation; the runs record none)"], [str(now["dirty"])]
    commands = [launch["command"] for d in sweep_dirs for launch in read_launches(d)]
    commands = list(dict.fromkeys(commands))
    command_source = "recorded at launch"
    if not commands:
        commands, command_source = [reconstruct_command(runs)], "reconstructed from the jobs' overrides"
    hw = {json.dumps(r.status["hardware"], sort_keys=True) for r in runs if r.status.get("hardware")}
    hardware_source = "recorded by the jobs"
    if not hw:
        hw, hardware_source = {json.dumps(hardware(), sort_keys=True)}, "of the aggregating machine; the runs record none"
    walls = [(float(r.status["wall_s"]), "job") if r.status.get("wall_s") is not None
             else (r.metrics.get("time/fit_s", math.nan), "fit") for r in runs]
    sources = {s for _, s in walls}
    wall_source = ("per-job wall clock of run() from status.json: training + evaluation" if sources == {"job"}
                   else "per-job time/fit_s from metrics.json (training only)" if sources == {"fit"}
                   else "status.json wall clock where recorded, else time/fit_s (training only)")
    seeds = {k: sorted({r.value(k) for r in runs if r.value(k) != MISSING}, key=_natural) for k in seed_keys}
    finite = [w for w, _ in walls if math.isfinite(w)]
    return {
        "commits": commits, "dirty": dirty, "commands": commands, "command_source": command_source,
        "seeds": {k: v for k, v in seeds.items() if v}, "hardware": [json.loads(h) for h in sorted(hw)],
        "hardware_source": hardware_source,
        "wall_time_s": {"sum": math.fsum(finite), "max": max(finite, default=math.nan), "jobs": len(finite),
                        "source": wall_source},
        "sweep_dirs": [str(d) for d in sweep_dirs], "n_runs": len(runs),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


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
    return [
        f"table: {name}",
        f"commit: {', '.join(prov['commits'])} (dirty: {', '.join(prov['dirty']) or 'unknown'})",
        *(f"command ({prov['command_source']}): {c}" for c in prov["commands"]),
        f"seeds: {seeds}",
        *(f"hardware ({prov['hardware_source']}): {_hardware_text(h)}" for h in prov["hardware"]),
        f"wall time: sum {w['sum']:.1f} s, max {w['max']:.1f} s over {w['jobs']} jobs ({w['source']})",
        f"runs: {prov['n_runs']} finished jobs in {', '.join(prov['sweep_dirs'])}; generated {prov['generated']}",
    ]


def to_markdown(name: str, rows: list[dict[str, Any]], group_by: list[str], metrics: list[str],
                prov: dict[str, Any], figures: list[tuple[str, str, Path]] = ()) -> str:
    head = [f"# {name}", ""] + [f"- {line}" for line in provenance_lines(name, prov)[1:]]
    head += ["", "Cells: mean ± standard error over the group's runs (n); (n=k) where a metric has fewer runs.", ""]
    columns = [*group_by, "n", *metrics]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(row[k]) for k in group_by] + [str(row["n"])]
        for m in metrics:
            mean, se, n = row[m]
            cell = f"{_fmt(mean)} ± {_fmt(se)}" if n > 1 else (_fmt(mean) if n == 1 else MISSING)
            cells.append(cell + (f" (n={n})" if 0 < n != row["n"] else ""))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if figures:
        lines += ["", "## Figures (first seed of each group)", ""]
        lines += [f"![{label}: {fig}]({path.parent.name}/{path.name})" for label, fig, path in figures]
    return "\n".join(head + lines) + "\n"


def to_csv(name: str, rows: list[dict[str, Any]], group_by: list[str], metrics: list[str],
           prov: dict[str, Any]) -> str:
    buf = io.StringIO()
    for line in provenance_lines(name, prov):
        buf.write(f"# {line}\n")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*group_by, "n", "seeds", *(f"{m}{s}" for m in metrics for s in (" mean", " se", " n"))])
    for row in rows:
        stats = [v for m in metrics for v in (repr(row[m][0]), repr(row[m][1]), row[m][2])]
        writer.writerow([*(row[k] for k in group_by), row["n"], row["seeds"], *stats])
    return buf.getvalue()


def aggregate(sweep_dirs: list[str | Path], name: str, metrics: list[str] | None = None,
              group_by: list[str] | None = None, seed_keys: list[str] | tuple[str, ...] | None = None,
              results_dir: str | Path = "results", figures: list[str] | None = None,
              model_selection: dict[str, Any] | None = None) -> list[Path]:
    """Write ``<results_dir>/<name>.md`` and ``.csv`` from the finished runs; returns both paths.

    ``figures``: names of ``figures/<fig>.png`` to copy, from each group's first seed, into
    ``<results_dir>/<name>_figures/`` and link from the markdown. ``model_selection``: a
    ``laplace_lab.model_selection`` spec; appends the marglik ranking section to the markdown.
    """
    if model_selection is not None:
        model_selection = validate_spec(model_selection)
    dirs = [Path(d) for d in sweep_dirs]
    seeds = tuple(DEFAULT_SEED_KEYS if seed_keys is None else seed_keys)
    runs = load_runs(dirs)
    if not runs:
        raise ValueError(f"no finished runs (metrics.json with {STATUS_FILE} state 'finished') under "
                         f"{', '.join(map(str, dirs))}")
    keys = list(group_by) if group_by is not None else default_group_by(runs, seeds)
    names = list(metrics) if metrics else default_metrics(runs)
    unknown = [m for m in names if not any(m in r.metrics for r in runs)]
    if unknown:
        raise ValueError(f"metrics {unknown} are in no run's metrics.json; allowed: {default_metrics(runs)}")
    rows = group_rows(runs, keys, names, seeds)
    prov = provenance(runs, dirs, seeds)
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path = out / f"{name}.md", out / f"{name}.csv"
    copied = copy_figures(runs, keys, list(figures or ()), seeds, out / f"{name}_figures")
    text = to_markdown(name, rows, keys, names, prov, copied)
    if model_selection is not None:
        text += "\n".join(selection_markdown(rank_candidates(runs, model_selection), model_selection)) + "\n"
    md.write_text(text)
    csv_path.write_text(to_csv(name, rows, keys, names, prov))
    return [md, csv_path]


def preset_spec(preset: str) -> dict[str, Any]:
    """The ``aggregate`` block of ``conf/experiment/<preset>.yaml`` (what its multirun uses)."""
    from omegaconf import OmegaConf

    from laplace_lab.train import CONF_DIR

    path = CONF_DIR / "experiment" / f"{preset}.yaml"
    if not path.is_file():
        allowed = sorted(f.stem for f in (CONF_DIR / "experiment").glob("*.yaml"))
        raise ValueError(f"--preset {preset!r} is not a preset; allowed: {allowed}")
    spec = OmegaConf.select(OmegaConf.load(path), "aggregate")
    if spec is None:
        raise ValueError(f"--preset {preset!r} has no `aggregate` block in {path}")
    return OmegaConf.to_container(spec, resolve=False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m laplace_lab.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dirs", nargs="+", type=Path, help="multirun folder(s), e.g. outputs/<exp>/multirun")
    p.add_argument("--preset", default=None,
                   help="take name, metrics, group-by, seed keys, figures and model selection from the "
                        "`aggregate` block of conf/experiment/<preset>.yaml (explicit options win)")
    p.add_argument("--name", default=None, help="table name: writes <results-dir>/<name>.md and .csv")
    p.add_argument("--metrics", nargs="+", default=None, help="metric keys (default: all but time/*)")
    p.add_argument("--group-by", nargs="+", default=None, help="method keys (default: the overrides less seeds)")
    p.add_argument("--seed-keys", nargs="+", default=None, help=f"replicate keys (default: {list(DEFAULT_SEED_KEYS)})")
    p.add_argument("--results-dir", default="results", type=Path)
    p.add_argument("--figures", nargs="+", default=None, help="figure names (figures/<name>.png) to copy")
    args = p.parse_args(argv)
    spec = preset_spec(args.preset) if args.preset else {}
    name = args.name or spec.get("name")
    if name is None:
        p.error("--name is required unless --preset gives one")
    for path in aggregate(args.sweep_dirs, name, args.metrics or spec.get("metrics"),
                          args.group_by or spec.get("group_by"),
                          args.seed_keys or spec.get("seed_keys") or list(DEFAULT_SEED_KEYS), args.results_dir,
                          args.figures or spec.get("figures"), spec.get("model_selection")):
        print(path)


if __name__ == "__main__":
    main()
