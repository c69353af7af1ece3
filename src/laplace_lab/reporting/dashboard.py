"""A sweep's dashboard: ``<sweep dir>/dashboard.html``, one self-contained page (figures inlined as
``data:`` URIs, CSS and JavaScript inline) that opens from the file system with no server and no
network. The ``SweepSummary`` callback writes it at the end of every multirun (through the
aggregator, ``sweep_table.SweepTable.dashboard``); to (re)build it for an existing sweep folder:

    python -m laplace_lab.reporting.dashboard <sweep dir> [--figures reliability confidence_hist]

It shows every finished run of the sweep's last launch (``summary.json``: the jobs it ran or
skipped as already finished), side by side: the figures each job already wrote (default: of
``figures/reliability.png``, the reliability diagram, ``figures/confidence_hist.png``, the
max-confidence histograms of the test and OOD sets, and ``figures/regression_coverage.png``, those
that a run wrote; nothing is redrawn), its headline metrics (the
aggregated table's metrics when the sweep was aggregated, else ``HEADLINE``) and all of its
``metrics.json``. A select per swept key (an override key with more than one value, seeds
included) filters the runs. The verdicts are the aggregated table's (the "Reference numbers" section
of ``<name>.md``, named in ``summary.json``'s ``results``: the sweep's preset judged by its reference
files when the table was written, ``laplace_lab.reporting.reference``); a sweep that was not
aggregated says so ("no verdicts: not aggregated"). Failed and unfinished jobs are listed with their errors.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import re
import sys
import time
from pathlib import Path
from typing import Any

from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.io.names import check_name
from laplace_lab.reporting import tables
from laplace_lab.reporting.dashboard_page import Card, Figure, Page, render
from laplace_lab.reporting.results_summary import SECTION, read_results_csv
from laplace_lab.sweeps.status import SUMMARY_FILE, read_json_file

PAGE_NAME = "dashboard.html"
COMMAND = "python -m laplace_lab.reporting.dashboard"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# figures/<name>.png shown per run (written by evaluation.runner), with their captions
FIGURES = {"reliability": "reliability diagram (test set)",
           "confidence_hist": "max-confidence histograms: test set against the OOD sets",
           "regression_coverage": "central-interval coverage (test set; regression)"}
# the headline metrics of a sweep that was not aggregated (fnmatch patterns over metrics.json keys)
HEADLINE = ("test/*/acc", "test/*/nll", "test/*/ece", "test/*/rmse", "ood/*/*/auroc", "ood/*/*/conf",
            "toy2d/far/*/conf")


def figure(job_dir: Path, name: str, skipped: dict[str, str]) -> Figure:
    """``figures/<name>.png`` of a job as a ``data:`` URI, or why it is not shown (missing: with
    the evaluation sections the job skipped, from its ``eval_report.json``; not a PNG file)."""
    caption = FIGURES.get(name, name)
    path = job_dir / "figures" / f"{name}.png"
    if not path.is_file():
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        return Figure(name, caption, missing=f"not drawn: no figures/{name}.png"
                      + (f" (evaluation skipped {why})" if why else ""))
    data = path.read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        return Figure(name, caption, missing=f"figures/{name}.png is not a PNG file ({len(data)} bytes)")
    return Figure(name, caption, uri="data:image/png;base64," + base64.b64encode(data).decode("ascii"))


def headline_names(runs: list[tables.Run], table_metrics: list[str] | None) -> list[str]:
    """The metrics shown in each card and the side-by-side table: the aggregated table's, else the
    runs' metrics matching ``HEADLINE`` (in its order, then sorted)."""
    if table_metrics:
        return list(table_metrics)
    logged = sorted({k for r in runs for k in r.metrics})
    return list(dict.fromkeys(k for pattern in HEADLINE for k in logged if fnmatch.fnmatchcase(k, pattern)))


def swept_keys(runs: list[tables.Run]) -> dict[str, list[str]]:
    """``{key: its values, naturally sorted}`` of every override key (less run-only keys, seeds
    kept) with more than one value among ``runs``."""
    out = {}
    for key in tables.default_group_by(runs, ()):
        values = {r.value(key) for r in runs}
        if len(values) > 1:
            out[key] = sorted(values, key=tables._natural)
    return out


def table_files(sweep_dir: Path, summary: dict[str, Any]) -> tuple[Path | None, Path | None]:
    """The aggregated ``<name>.md`` and ``<name>.csv`` that ``summary.json`` names (its ``results``),
    found under ``sweep_dir`` even when the folder was moved; (None, None) when it was not aggregated."""
    recorded = Path(str(summary.get("sweep_dir") or sweep_dir))
    found: dict[str, Path] = {}
    for text in summary.get("results") or []:
        path = Path(text)
        path = sweep_dir / path.relative_to(recorded) if path.is_relative_to(recorded) else path
        if not path.name.endswith(".jobs.csv"):
            found.setdefault(path.suffix, path)
    return found.get(".md"), found.get(".csv")


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row (``\\|`` is a pipe inside a cell)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def verdicts(md_path: Path | None) -> tuple[list[dict[str, str]] | None, str]:
    """(verdict rows, the note above them) from the "Reference numbers" section of the aggregated
    table ``md_path`` (written by ``tables`` with ``reference.to_markdown``: the verdicts of the
    preset's reference files at the end of the sweep); rows are None when there are none, and the
    note says why."""
    if md_path is None:
        return None, "no verdicts: not aggregated"
    if not md_path.is_file():
        return None, f"no verdicts: the aggregated table {md_path} is missing"
    lines = md_path.read_text().splitlines()
    if SECTION not in lines:
        return None, f"no verdicts: {md_path.name} has no reference section (the sweep is not a preset's)"
    start = lines.index(SECTION) + 1
    section = lines[start:next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))]
    note = " ".join(line for line in section if line.strip() and not line.startswith("|")).replace("`", "")
    note = re.sub(r"(?<![\w/])\*(\w[^*]*?\w)\*(?![\w/])", r"\1", note)  # *emphasis*, not a glob's *
    table = [line for line in section if line.startswith("|")]
    if not table:
        return None, note
    head = _cells(table[0])
    rows = [dict(zip(head, _cells(line))) for line in table[2:]]
    for row in rows:
        row["verdict"] = row.get("verdict", "").replace("**", "")
    return rows, f"The verdicts of {md_path.name}. {note}"


def build(sweep_dir: str | Path, figures: list[str] | tuple[str, ...] | None = None) -> Path:
    """Write ``<sweep_dir>/dashboard.html`` from the sweep's ``summary.json`` and its jobs' files;
    returns its path. ``figures``: the ``figures/<name>.png`` shown per run (default: those of
    ``FIGURES`` that at least one run wrote). A ``FileNotFoundError`` when the folder or its
    ``summary.json`` is missing (a launch that has not ended), a ``ValueError`` for an unreadable
    summary or an empty ``figures``."""
    sweep_dir = Path(sweep_dir)
    if figures is not None and not figures:
        raise ValueError("figures is empty; give at least one figure name, e.g. " + " ".join(FIGURES))
    for name in figures or ():
        check_name(name, "figure name (--figures: figures/<name>.png)")
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder {sweep_dir} does not exist")
    summary, error = read_json_file(sweep_dir / SUMMARY_FILE)
    if error and not (sweep_dir / SUMMARY_FILE).exists():
        raise FileNotFoundError(f"{sweep_dir} has no {SUMMARY_FILE}: not a multirun folder, or its launch has not "
                                "ended (the SweepSummary callback writes it at the end)")
    if error:
        raise ValueError(f"{sweep_dir / SUMMARY_FILE}: {error}")
    runs, problems = [], []
    for job in [*summary.get("finished", []), *summary.get("skipped", [])]:
        run, why = tables.load_run(sweep_dir / job)
        if run is None:
            problems.append(f"{job}: {why or 'not finished'}")
        else:
            runs.append(run)
    problems += [f"{f['job']}: failed ({f.get('error')})" for f in summary.get("failed", [])]
    problems += [f"{job}: unfinished (no end marker: killed?)" for job in summary.get("unfinished", [])]
    if figures is None:
        figures = [n for n in FIGURES if any((r.path / "figures" / f"{n}.png").is_file() for r in runs)]
    md_path, csv_path = table_files(sweep_dir, summary)
    table = read_results_csv(csv_path) if csv_path is not None and csv_path.is_file() else None
    table_metrics = [k for k in table[0][0] if k not in table[1]] if table and table[0] else None
    names = headline_names(runs, table_metrics)
    swept = swept_keys(runs)
    cards = []
    for run in runs:
        report = read_json_file(run.path / "eval_report.json")[0] or {}
        skipped = report.get("skipped") or {}
        cards.append(Card(job=str(run.path.relative_to(sweep_dir)), values={k: run.value(k) for k in swept},
                          figures=[figure(run.path, name, skipped) for name in figures],
                          headline={m: run.metrics[m] for m in names if m in run.metrics}, metrics=run.metrics))
    shown, note = verdicts(md_path)
    counts = summary.get("counts") or {}
    header = [("sweep folder", str(sweep_dir.resolve())), ("command", str(summary.get("command"))),
              ("launch", f"{summary.get('launch_id')}: {summary.get('started')} to {summary.get('ended')}"),
              ("jobs", ", ".join(f"{v} {k}" for k, v in counts.items())),
              ("table", str(md_path) if md_path else "not aggregated"),
              ("figures", ", ".join(figures) or f"none: no run wrote figures/<name>.png for any of {', '.join(FIGURES)}"),
              ("page", f"written {time.strftime('%Y-%m-%d %H:%M:%S %z')}; rebuild: {COMMAND} {sweep_dir}")]
    page = Page(title=f"sweep {sweep_dir.name}", header=header, swept=swept, cards=cards, headline_names=names,
                verdicts=shown, verdict_note=note, problems=problems)
    out = sweep_dir / PAGE_NAME
    write_text_atomic(out, render(page))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir", type=Path, help="a multirun folder (with its summary.json)")
    p.add_argument("--figures", nargs="+", default=None,
                   help=f"figures/<name>.png to show per run (default: those of {' '.join(FIGURES)} that a run wrote)")
    args = p.parse_args(argv)
    try:
        out = build(args.sweep_dir, args.figures)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"{COMMAND}: error: {err}")
    print(out)


if __name__ == "__main__":
    main()
