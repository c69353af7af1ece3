"""``results/README.md``: one page over every reproduced paper, generated from the reference files
(``experiments/*/*reference*.yaml``) and the committed tables (``results/<table>.csv``).

Per paper: its headline claims, one line each with the verdicts of the rows that test them, and per
table the counts of quantitative rows (``paper`` and ``peer`` entries) that reproduce the paper,
match the authors' code, miss, or were not run (each with why), beside the quoted orderings.
Reference files of the first format (untraced sources) are named, not counted.

    python -m laplace_lab.reporting.results_summary           # write results/README.md
    python -m laplace_lab.reporting.results_summary --check   # exit 1 when results/README.md is stale
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laplace_lab.reporting import reference as ref
from laplace_lab.sweeps.status import REPO_ROOT

EXPERIMENTS_DIR = REPO_ROOT / "experiments"
RESULTS_DIR = REPO_ROOT / "results"
COMMAND = "python -m laplace_lab.reporting.results_summary"
REPRODUCES, MISSES = ("reproduces", ref.MATCHES), ("does not reproduce", ref.DIFFERS)


@dataclass
class Judged:
    table: str                 # the committed table judged ("" for peer entries: they read their CSV)
    verdict: ref.Verdict


def read_results_csv(path: str | Path) -> tuple[list[ref.Row], list[str]]:
    """The rows (group-by values, ``metric -> (mean, se, n)``) and group-by keys of a committed
    ``results/<table>.csv`` (``laplace_lab.reporting.tables.to_csv``: the group-by columns come before ``n``)."""
    lines = [line for line in Path(path).read_text().splitlines() if not line.startswith("#")]
    reader = csv.reader(lines)
    header = next(reader)
    if "n" not in header:
        raise ValueError(f"{path}: no `n` column: not a table written by laplace_lab.reporting.tables")
    group_by = header[:header.index("n")]
    metrics = [c[:-len(" mean")] for c in header if c.endswith(" mean")]
    rows = []
    for cells in reader:
        record = dict(zip(header, cells))
        row: dict[str, Any] = {k: record[k] for k in group_by}
        for m in metrics:
            n = int(record[f"{m} n"] or 0)
            row[m] = (float(record[f"{m} mean"]), float(record[f"{m} se"]), n)
        rows.append(row)
    return rows, group_by


def judge_file(loaded: dict[str, Any], results_dir: Path) -> list[Judged]:
    """Every entry of one loaded reference file judged: peer entries once, the others against each
    table the file names (not run, with why, where the table is not committed)."""
    entries = loaded["references"]
    out = [Judged("", v) for v in ref.verdicts([e for e in entries if e["kind"] == "peer"], [], [])]
    table_entries = [e for e in entries if e["kind"] != "peer"]
    for table in loaded["tables"] if table_entries else ():
        path = results_dir / f"{table}.csv"
        if path.is_file():
            rows, group_by = read_results_csv(path)
            out += [Judged(table, v) for v in ref.verdicts(table_entries, rows, group_by)]
        else:
            keys = sorted({k for e in table_entries for side in ([e] if "row" in e else [e["lhs"], e["rhs"]])
                           for k in side["row"]})
            for e, v in zip(table_entries, ref.verdicts(table_entries, [], keys)):
                v.why = "; ".join(x for x in (f"results/{table}.csv is not committed (the table was not run)",
                                              e.get("not_run_reason", "")) if x)
                out.append(Judged(table, v))
    return out


def _count(judged: list[Judged], verdicts: tuple[str, ...]) -> int:
    return sum(j.verdict.verdict in verdicts for j in judged)


def headline_line(claim: str, ids: list[str], judged: list[Judged]) -> str:
    """``- claim: k of n rows reproduce or match (ids ...)``, over every table that judged them."""
    hits = [j for j in judged if j.verdict.id in ids]
    counts = Counter(j.verdict.verdict for j in hits)
    parts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: ref.VERDICTS.index(kv[0])))
    return f"- {claim}: {parts} (rows: {', '.join(f'`{i}`' for i in ids)})"


def table_line(name: str, judged: list[Judged], results_dir: Path) -> str:
    shown = f"[{name}]({name}.md)" if (results_dir / f"{name}.md").is_file() else f"{name} (not committed)"
    return "| " + " | ".join([shown if name else "peer CSVs (authors' code)", *counts_cells(judged)]) + " |"


def paper_title(folder: str, files: list[dict[str, Any]]) -> str:
    current = [f for f in files if f["format"] == 2]
    return current[0]["paper"] if current else folder


def counts_cells(judged: list[Judged]) -> list[str]:
    """reproduce the paper (k of n), match the authors' code (k of n), miss, not run, orderings."""
    paper = [j for j in judged if j.verdict.kind == "paper"]
    peer = [j for j in judged if j.verdict.kind == "peer"]
    claims = [j for j in judged if j.verdict.kind == "claim"]
    return [f"{_count(paper, REPRODUCES)} of {len(paper)}", f"{_count(peer, REPRODUCES)} of {len(peer)}",
            str(_count(paper + peer, MISSES)), str(_count(paper + peer, ("not run",))),
            f"{_count(claims, ('reproduces',))} / {_count(claims, ('within noise',))} / "
            f"{_count(claims, ('does not reproduce',))} / {_count(claims, ('not run',))}"]


HEADER = ("| reproduce the paper | match the authors' code | miss | not run | "
          "quoted orderings: hold / within noise / fail / not run |")


def paper_section(folder: str, files: list[dict[str, Any]], results_dir: Path) -> list[str]:
    """The markdown of one paper (one experiments/<folder>)."""
    current = [f for f in files if f["format"] == 2]
    old = [f for f in files if f["format"] == 1]
    title = paper_title(folder, files)
    lines = [f"## {title}", "", f"Folder: [experiments/{folder}](../experiments/{folder}/); reference files: "
             + ", ".join(f"`{f['path'].name}`" for f in files) + ".", ""]
    judged = {id(f): judge_file(f, results_dir) for f in current}
    heads = [(h, judged[id(f)]) for f in current for h in (f["headline"] or [])]
    if heads:
        lines += ["Headline claims (verdicts of the rows that test them, over every table judged):", ""]
        lines += [headline_line(h["claim"], h["ids"], j) for h, j in heads] + [""]
    if current:
        lines += ["| table " + HEADER, "|---|---|---|---|---|---|"]
        by_table: dict[str, list[Judged]] = {}
        for f in current:
            for j in judged[id(f)]:
                by_table.setdefault(j.table, []).append(j)
        lines += [table_line(name, js, results_dir) for name, js in by_table.items()] + [""]
        everything = [j for js in judged.values() for j in js]
        where = lambda j: f"`{j.verdict.id}`" + (f" ({j.table})" if j.table else "")  # noqa: E731
        misses = [j for j in everything if j.verdict.verdict in MISSES and j.verdict.kind in ("paper", "peer")]
        fails = [j for j in everything if j.verdict.verdict == "does not reproduce" and j.verdict.kind == "claim"]
        if misses:
            lines += ["Quantitative rows that miss: " + "; ".join(map(where, misses)) + ".", ""]
        if fails:
            lines += ["Quoted orderings that fail: " + "; ".join(map(where, fails)) + ".", ""]
        not_run = [j for j in everything if j.verdict.verdict == "not run" and j.verdict.kind in ("paper", "peer")]
        if not_run:
            lines += ["Quantitative rows not run:", ""]
            grouped: dict[str, list[Judged]] = {}
            for j in not_run:
                grouped.setdefault(j.verdict.reason or j.verdict.why, []).append(j)
            lines += [f"- {len(js)} row(s), {why}: " + ", ".join(map(where, js)) for why, js in grouped.items()]
            lines += [""]
    for f in old:
        n_values = sum(e["kind"] == "value" for e in f["references"])
        n_claims = sum(e["kind"] == "claim" for e in f["references"])
        lines += [f"`{f['path'].name}` ({', '.join(f['tables'])}): first reference format (sources not traced to a "
                  f"table cell, orderings not quoted), so its {n_values} value(s) and {n_claims} claim(s) are not "
                  "counted here; their verdicts are in the tables.", ""]
    return lines


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def render(experiments_dir: Path = EXPERIMENTS_DIR, results_dir: Path = RESULTS_DIR) -> str:
    """The text of ``results/README.md``."""
    files: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(experiments_dir).glob("*/*reference*.yaml")):
        files.setdefault(path.parent.name, []).append(ref.load_reference(path))
    lines = ["# Reproduced papers: what holds here", "",
             f"Generated by `{COMMAND}` from `experiments/*/*reference*.yaml` and the committed tables "
             "`results/<table>.csv`; do not edit by hand. How rows are judged:", "",
             *(f"- {ref.RULES[k]}" for k in ("paper", "peer", "claim")), ""]
    overview = ["| paper (experiments folder) " + HEADER, "|---|---|---|---|---|---|"]
    sections: list[str] = []
    for folder, loaded in files.items():
        current = [f for f in loaded if f["format"] == 2]
        title = f"[{folder}](#{_anchor(paper_title(folder, loaded))})"
        if current:
            judged = [j for f in current for j in judge_file(f, Path(results_dir))]
            overview.append("| " + " | ".join([title, *counts_cells(judged)]) + " |")
        else:
            overview.append(f"| {title} | first reference format: not counted | | | | |")
        sections += paper_section(folder, loaded, Path(results_dir))
    lines += overview + [""] + sections
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when results/README.md differs from the "
                                                             "generated text (nothing is written)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "README.md")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.is_file() else ""
        if current != text:
            print(f"{args.output} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
