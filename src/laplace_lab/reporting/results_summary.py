"""``results/README.md``: one page over every reproduced paper, generated from the reference files
(``experiments/*/*reference*.yaml``) and the committed tables (``results/<table>.csv``), and the one
source of every verdict shown elsewhere: the "Reference numbers" section of each committed
``results/<table>.md`` and the top README's preset table (``preset_table``: one row per preset
folder, its cost and smoke command, its verdicts) are rewritten from the same judgement (``--check``
fails on any difference).

Per paper: its headline claims, one line each with the verdicts of the rows that test them, and per
table the counts of rows that reproduce the paper, match the authors' code, match laplace-torch, are
inconclusive, miss, fail or were not run (each with why); checks (both sides the same code path) and
retired rows are listed apart and never counted. Reference files of the first format (untraced
sources) are named, not counted.

    python -m laplace_lab.reporting.results_summary           # write results/README.md, results/*.md, README.md
    python -m laplace_lab.reporting.results_summary --check   # exit 1 when any of them is stale
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laplace_lab.reporting import preset_table, table_commit
from laplace_lab.reporting import reference as ref
from laplace_lab.reporting import verdict_rules as rules
from laplace_lab.sweeps.status import REPO_ROOT

EXPERIMENTS_DIR = REPO_ROOT / "experiments"
RESULTS_DIR = REPO_ROOT / "results"
README = REPO_ROOT / "README.md"
COMMAND = "python -m laplace_lab.reporting.results_summary"


class ResultsCSVError(ValueError):
    """A committed results table that cannot be read; the message names the file, line and column."""


@dataclass
class Judged:
    table: str                 # the committed table judged ("" for peer entries: they read their CSV)
    verdict: ref.Verdict
    code: str = ""             # peer entries: whose code the CSV ran (a key of reference.PEER_CODES)


def read_results_csv(path: str | Path) -> tuple[list[ref.Row], list[str]]:
    """The rows (group-by values, ``metric -> (mean, se, n)``) and group-by keys of a committed
    ``results/<table>.csv`` (``laplace_lab.reporting.tables.to_csv``: the group-by columns come before ``n``).
    A ``ResultsCSVError`` naming the file, line and column for a file that is empty, truncated or not
    numeric where it must be."""
    path = Path(path)
    numbered = [(i, line) for i, line in enumerate(path.read_text().splitlines(), start=1) if not line.startswith("#")]
    if not numbered:
        raise ResultsCSVError(f"{path}: has no header line: regenerate it with "
                              "`python -m laplace_lab.reporting.tables --preset <name> --commit-results`")
    header = next(csv.reader([numbered[0][1]]))
    if "n" not in header:
        raise ResultsCSVError(f"{path}: line {numbered[0][0]}: no `n` column: not a table written by "
                              "laplace_lab.reporting.tables")
    group_by = header[:header.index("n")]
    metrics = [c[:-len(" mean")] for c in header if c.endswith(" mean")]
    missing = [f"{m} {part}" for m in metrics for part in ("se", "n") if f"{m} {part}" not in header]
    if missing:
        raise ResultsCSVError(f"{path}: line {numbered[0][0]}: header lacks column(s) {missing}")
    rows = []
    for line_no, cells in zip((i for i, _ in numbered[1:]), csv.reader(line for _, line in numbered[1:])):
        if len(cells) != len(header):
            raise ResultsCSVError(f"{path}: line {line_no}: has {len(cells)} cells where the header has "
                                  f"{len(header)} (a truncated or hand-edited file?)")
        record = dict(zip(header, cells))
        row: dict[str, Any] = {k: record[k] for k in group_by}
        for m in metrics:
            column = f"{m} n"
            try:
                n = int(record[column] or 0)
                column = f"{m} mean"
                mean = float(record[column])
                column = f"{m} se"
                se = float(record[column])
            except ValueError:
                raise ResultsCSVError(f"{path}: line {line_no}, column {column!r}: {record[column]!r} is not a "
                                      "number") from None
            row[m] = (mean, se, n)
        rows.append(row)
    return rows, group_by


def reads_peer_csv(entry: dict[str, Any]) -> bool:
    """A peer entry, or a claim judged on one side of a peer CSV (``csv``): judged once, not per table."""
    return entry["kind"] == "peer" or "csv" in entry


def judge_file(loaded: dict[str, Any], results_dir: Path) -> list[Judged]:
    """Every entry of one loaded reference file judged: entries that read a peer CSV once, the others
    against each table the file names (not run, with why, where the table is not committed)."""
    entries = loaded["references"]
    peers = [e for e in entries if reads_peer_csv(e)]
    out = [Judged("", v, e["_code"]) for e, v in zip(peers, ref.verdicts(peers, [], []))]
    table_entries = [e for e in entries if not reads_peer_csv(e)]
    for table in loaded["tables"] if table_entries else ():
        path = table_commit.settled_table(results_dir, table)[1]
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


def _of(judged: list[Judged], kind: str, wins: tuple[str, ...], code: str | None = None) -> str:
    """``k of n``: rows of ``kind`` (and peer ``code``) with a verdict in ``wins``, checks left out, and
    claims judged on the peer's side of a peer CSV (``side: theirs``) left out: they judge the peer's
    code, not a reproduction here."""
    rows = [j for j in judged if j.verdict.kind == kind and j.verdict.verdict != rules.CHECK
            and (code is None or j.code == code) and j.verdict.side != "theirs"]
    return f"{_count(rows, wins)} of {len(rows)}"


def headline_line(claim: str, ids: list[str], judged: list[Judged]) -> str:
    """``- claim: counts of verdicts (ids ...)``, over every table that judged them."""
    hits = [j for j in judged if j.verdict.id in ids]
    counts = Counter(j.verdict.verdict for j in hits)
    parts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: ref.VERDICTS.index(kv[0])))
    return f"- {claim}: {parts} (rows: {', '.join(f'`{i}`' for i in ids)})"


def table_line(name: str, judged: list[Judged], results_dir: Path) -> str:
    shown = f"[{name}]({name}.md)" if (results_dir / f"{name}.md").is_file() else f"{name} (not committed)"
    return "| " + " | ".join([shown if name else "peer CSVs", *counts_cells(judged)]) + " |"


def paper_title(folder: str, files: list[dict[str, Any]]) -> str:
    current = [f for f in files if f["format"] == 2]
    return current[0]["paper"] if current else folder


COLUMNS = ("paper values reproduced", "claims reproduced", "match the authors' code", "match laplace-torch",
           "inconclusive", "misses", "fails", "not run", "checks (not counted)")
HEADER = "| " + " | ".join(COLUMNS) + " |"
RULE = "|---" * (len(COLUMNS) + 1) + "|"


def counts_cells(judged: list[Judged]) -> list[str]:
    """One cell per ``COLUMNS``: k of n for paper values, claims and each peer's code; counts of
    inconclusive, misses, fails, not run and checks."""
    return [_of(judged, "paper", (rules.REPRODUCES,)), _of(judged, "claim", (rules.REPRODUCES,)),
            _of(judged, "peer", (ref.MATCHES,), "authors"),
            _of(judged, "peer", (ref.MATCHES_LAPLACE_TORCH,), "laplace-torch"),
            str(_count(judged, (rules.INCONCLUSIVE,))), str(_count(judged, (rules.MISSES,))),
            str(_count(judged, (rules.FAILS,))), str(_count(judged, (rules.NOT_RUN,))),
            str(_count(judged, (rules.CHECK,)))]


def short_verdict(judged: list[Judged]) -> str:
    """The counts of ``judged`` in one phrase for the top README's preset table (zero counts left out)."""
    cells = dict(zip(COLUMNS, counts_cells(judged)))
    parts = [f"{label} {cells[column]}" for column, label in (
        ("paper values reproduced", "paper"), ("claims reproduced", "claims"),
        ("match the authors' code", "authors' code"), ("match laplace-torch", "laplace-torch"))
        if not cells[column].endswith(" of 0")]
    parts += [f"{cells[c]} {c}" for c in ("inconclusive", "misses", "fails", "not run") if cells[c] != "0"]
    return "; ".join(parts) or "no judged rows"


def _where(j: Judged) -> str:
    return f"`{j.verdict.id}`" + (f" ({j.table})" if j.table else "")


def _numbers(j: Judged) -> str:
    """One listed row with its numbers: ours against the reference (a claim: its two sides and interval)."""
    v = j.verdict
    if v.kind == "claim":
        return f"{_where(j)}: {v.metric}: {v.ours}; {v.why}"
    return f"{_where(j)}: ours {v.ours}; {v.reference}"


def paper_section(folder: str, files: list[dict[str, Any]], results_dir: Path,
                  judged: dict[int, list[Judged]] | None = None) -> list[str]:
    """The markdown of one paper (one experiments/<folder>); ``judged``: ``judge_all``'s result, if
    already computed."""
    current = [f for f in files if f["format"] == 2]
    old = [f for f in files if f["format"] == 1]
    title = paper_title(folder, files)
    lines = [f"## {title}", "", f"Folder: [experiments/{folder}](../experiments/{folder}/); reference files: "
             + ", ".join(f"`{f['path'].name}`" for f in files) + ".", ""]
    judged = judged if judged is not None else judge_all({folder: files}, results_dir)
    judged = {id(f): judged[id(f)] for f in current}  # this paper's files only
    findings = [x for f in current for x in f["findings"]]
    if findings:
        lines += ["Findings a reader needs to read these verdicts:", ""] + [f"- {x}" for x in findings] + [""]
    heads = [(h, judged[id(f)]) for f in current for h in (f["headline"] or [])]
    if heads:
        lines += ["Headline claims (verdicts of the rows that test them, over every table judged):", ""]
        lines += [headline_line(h["claim"], h["ids"], j) for h, j in heads] + [""]
    if current:
        lines += ["| table " + HEADER, RULE]
        by_table: dict[str, list[Judged]] = {}
        for f in current:
            for j in judged[id(f)]:
                by_table.setdefault(j.table, []).append(j)
        lines += [table_line(name, js, results_dir) for name, js in by_table.items()] + [""]
        everything = [j for js in judged.values() for j in js]
        for verdict, title_ in ((rules.MISSES, "Rows that miss"), (rules.FAILS, "Claims that fail"),
                                (rules.INCONCLUSIVE, "Inconclusive rows")):
            hits = [j for j in everything if j.verdict.verdict == verdict]
            if hits:
                lines += [f"{title_} ({len(hits)}):", ""] + [f"- {_numbers(j)}" for j in hits] + [""]
        checks = [j for j in everything if j.verdict.verdict == rules.CHECK]
        if checks:
            lines += [f"Checks, not counted ({len(checks)}): " + "; ".join(
                f"{_where(j)} ({j.verdict.why})" for j in checks) + ".", ""]
        not_run = [j for j in everything if j.verdict.verdict == rules.NOT_RUN]
        if not_run:
            lines += ["Rows not run:", ""]
            grouped: dict[str, list[Judged]] = {}
            for j in not_run:
                grouped.setdefault(j.verdict.reason or j.verdict.why, []).append(j)
            lines += [f"- {len(js)} row(s), {why}: " + ", ".join(map(_where, js)) for why, js in grouped.items()]
            lines += [""]
        retired = [r for f in current for r in f["retired"]]
        if retired:
            lines += ["Retired rows (not judged):", ""]
            lines += [f"- `{r['id']}`: {r['what']} Retired because: {r['reason']}" for r in retired] + [""]
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


def load_all(experiments_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every reference file, loaded, by experiments folder."""
    files: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(experiments_dir).glob("*/*reference*.yaml")):
        files.setdefault(path.parent.name, []).append(ref.load_reference(path))
    return files


def judge_all(files: dict[str, list[dict[str, Any]]], results_dir: Path) -> dict[int, list[Judged]]:
    """``judge_file`` of every format-2 file of ``load_all``'s result, by ``id`` of the loaded file."""
    return {id(f): judge_file(f, Path(results_dir)) for loaded in files.values() for f in loaded if f["format"] == 2}


def render(experiments_dir: Path = EXPERIMENTS_DIR, results_dir: Path = RESULTS_DIR,
           files: dict[str, list[dict[str, Any]]] | None = None,
           judged: dict[int, list[Judged]] | None = None) -> str:
    """The text of ``results/README.md`` (``files`` / ``judged``: ``load_all`` / ``judge_all``, if done)."""
    files = files if files is not None else load_all(experiments_dir)
    judged = judged if judged is not None else judge_all(files, results_dir)
    lines = ["# Reproduced papers: what holds here", "",
             f"Generated by `{COMMAND}` from `experiments/*/*reference*.yaml` and the committed tables "
             "`results/<table>.csv`; do not edit by hand. The same judgement writes the \"Reference numbers\" "
             "section of every `results/<table>.md` and the verdicts of the top README. How rows are judged "
             "(`laplace_lab.reporting.verdict_rules`):", "",
             *(f"- {ref.RULES[k]}" for k in ("paper", "claim", "peer")),
             "- *not run*: the table or CSV has no such row or metric (the reason is listed). A row taken out "
             "of the judgement stays in its file under `retired:` with its reason, and is listed below.", "",
             "Each count `k of n` leaves checks out, and claims judged on the peer's code (`side: theirs`); "
             "`inconclusive`, `misses`, `fails`, `not run` count rows of every kind.", ""]
    overview = ["| paper (experiments folder) " + HEADER, RULE]
    sections: list[str] = []
    for folder, loaded in files.items():
        current = [f for f in loaded if f["format"] == 2]
        title = f"[{folder}](#{_anchor(paper_title(folder, loaded))})"
        if current:
            overview.append("| " + " | ".join([title, *counts_cells([j for f in current for j in judged[id(f)]])])
                            + " |")
        else:
            overview.append(f"| {title} | first reference format: not counted" + " |" * len(COLUMNS))
        sections += paper_section(folder, loaded, Path(results_dir), judged)
    lines += overview + [""] + sections
    return "\n".join(lines).rstrip() + "\n"


SECTION = "## Reference numbers"


def table_reports(experiments_dir: Path = EXPERIMENTS_DIR, results_dir: Path = RESULTS_DIR,
                  files: dict[str, list[dict[str, Any]]] | None = None) -> dict[Path, str]:
    """``results/<table>.md`` -> its text with the "Reference numbers" section rewritten from the
    committed CSV and every format-2 reference file that judges the table (only tables whose report
    has such a section; the section ends at the next ``## `` heading)."""
    by_table: dict[str, list[dict[str, Any]]] = {}
    for loaded in (files if files is not None else load_all(experiments_dir)).values():
        for f in loaded:
            if f["format"] == 2:
                for table in f["tables"]:
                    by_table.setdefault(table, []).append(f)
    out = {}
    for table, files in sorted(by_table.items()):
        md, csv_path, _ = table_commit.settled_table(Path(results_dir), table)
        if not (md.is_file() and csv_path.is_file()):
            continue
        text = md.read_text()
        lines = text.splitlines()
        if SECTION not in lines:
            continue
        rows, group_by = read_results_csv(csv_path)
        entries = [e for f in files for e in f["references"] if not reads_peer_csv(e)]
        names = [str(f["path"].relative_to(Path(experiments_dir).parent)) if f["path"].is_relative_to(
            Path(experiments_dir).parent) else f["path"].name for f in files]
        section = ref.to_markdown(ref.verdicts(entries, rows, group_by), names,
                                  [r for f in files for r in f["retired"]])
        start = lines.index(SECTION)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        head = lines[:start]
        while head and not head[-1].strip():
            head.pop()
        tail = [""] + lines[end:] if end < len(lines) else []
        out[md] = "\n".join(head + section + tail).rstrip() + "\n"
    return out


def readme_text(readme: Path = README, experiments_dir: Path = EXPERIMENTS_DIR, results_dir: Path = RESULTS_DIR,
                files: dict[str, list[dict[str, Any]]] | None = None,
                judged: dict[int, list[Judged]] | None = None) -> str:
    """The top README with its preset table rewritten (``preset_table``): one row per preset folder,
    the verdicts from the judgement of that preset's committed table."""
    files = files if files is not None else load_all(experiments_dir)
    judged = judged if judged is not None else judge_all(files, results_dir)
    by_table: dict[str, list[Judged]] = {}
    for loaded in files.values():
        for f in loaded:
            for j in judged.get(id(f), ()):
                for table in ([j.table] if j.table else f["tables"]):
                    by_table.setdefault(table, []).append(j)
    verdicts = {name: short_verdict(js) for name, js in by_table.items() if (Path(results_dir) / f"{name}.csv").is_file()}
    table = preset_table.render(preset_table.load_presets(experiments_dir), Path(results_dir), verdicts)
    return preset_table.replace_table(readme.read_text(), table, readme.name)


def outputs() -> dict[Path, str]:
    """Every generated file and its text: results/README.md, the table reports, the top README."""
    files = load_all(EXPERIMENTS_DIR)
    judged = judge_all(files, RESULTS_DIR)
    return {RESULTS_DIR / "README.md": render(files=files, judged=judged), **table_reports(files=files),
            README: readme_text(files=files, judged=judged)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when any generated file differs from the "
                                                             "generated text (nothing is written)")
    args = parser.parse_args(argv)
    try:
        generated = outputs()
    except (ref.ReferenceFileError, ResultsCSVError, preset_table.PresetFolderError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = [p for p, text in generated.items() if (p.read_text() if p.is_file() else "") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO_ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(generated[path])
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
