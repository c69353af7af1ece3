"""A second, independent computation of every positive verdict in the committed pages: from the
committed CSVs and the reference files read as plain YAML, with scipy's own t tests, no code of
``laplace_lab.reporting.reference`` or ``verdict_rules``. A positive verdict ("reproduces the paper",
"matches ...") that this computation rejects fails the test."""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from laplace_lab.reporting import results_summary as rs

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _table(name: str) -> dict[tuple, dict[str, tuple[float, float, int]]]:
    lines = [line for line in (ROOT / "results" / f"{name}.csv").read_text().splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    keys = list(rows[0])[:list(rows[0]).index("n")]
    out = {}
    for r in rows:
        metrics = {c[:-5]: (float(r[c]), float(r[c[:-5] + " se"]), int(r[c[:-5] + " n"] or 0))
                   for c in r if c.endswith(" mean")}
        out[tuple((k, r[k]) for k in keys)] = metrics
    return out


def _pick(table: dict, row: dict, metric: str):
    def same(a, b):
        try:
            return float(a) == float(b)
        except ValueError:
            return str(a) == str(b)
    hits = [m for key, m in table.items() if all(same(dict(key)[k], v) for k, v in row.items())]
    return hits[0].get(metric) if len(hits) == 1 else None


def _claim_positive(entry: dict, table: dict) -> bool:
    """Welch's t test from the summary statistics, 95% two-sided interval on the claimed side."""
    lhs, rhs = _pick(table, entry["lhs"]["row"], entry["lhs"]["metric"]), _pick(table, entry["rhs"]["row"],
                                                                                   entry["rhs"]["metric"])
    if lhs is None or rhs is None or lhs[2] < 2 or rhs[2] < 2:
        return False
    (m1, s1, n1), (m2, s2, n2) = lhs, rhs
    v1, v2 = s1 ** 2, s2 ** 2
    df = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1)) if v1 + v2 > 0 else min(n1, n2) - 1
    half = stats.t.ppf(0.975, df) * math.sqrt(v1 + v2)
    d = m1 - m2 + (entry.get("margin", 0.0) if entry["op"] in (">", ">=") else -entry.get("margin", 0.0))
    return d - half > 0 if entry["op"] in (">", ">=") else d + half < 0


def _peer_records(folder: Path, name: str) -> list[dict[str, str]]:
    """The data rows of the peer CSV ``folder / name`` (``#`` lines left out)."""
    lines = [line for line in (folder / name).read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def _in_row(record: dict[str, str], row: dict) -> bool:
    """``record`` has every setting of ``row`` (numbers compared as numbers)."""
    return all(str(record[k]) == str(v) or _num_eq(record[k], v) for k, v in row.items())


def _side_table(folder: Path, entry: dict) -> dict[tuple, dict[str, tuple[float, float, int]]]:
    """For a claim judged on one side of a peer CSV (``csv`` + ``side``): {row key: {metric: (mean, se, n)}}
    over that side's seeds, from the raw CSV, for the two rows and metrics the claim names."""
    records = [r for r in _peer_records(folder, entry["csv"]) if r["side"] == entry["side"]]
    out = {}
    for side in (entry["lhs"], entry["rhs"]):
        vals = np.array([float(r[side["metric"]]) for r in records if r[side["metric"]] and _in_row(r, side["row"])])
        se = vals.std(ddof=1) / math.sqrt(len(vals)) if len(vals) > 1 else math.nan
        out.setdefault(tuple(side["row"].items()), {})[side["metric"]] = (vals.mean(), se, len(vals))
    return out


def _peer_positive(entry: dict, folder: Path, margins: list[dict]) -> bool:
    """The two one-sided tests at 2.5% each (a 95% interval inside the margin), from the raw CSV."""
    import fnmatch
    values: dict[str, dict[int, float]] = {"ours": {}, "theirs": {}}
    for r in _peer_records(folder, entry["csv"]):
        if _in_row(r, entry["row"]) and r[entry["metric"]]:
            values[r["side"]][int(r["seed"])] = float(r[entry["metric"]])
    seeds = sorted(set(values["ours"]) & set(values["theirs"]))
    d = np.array([values["ours"][s] - values["theirs"][s] for s in seeds])
    if len(d) < 3:
        return False
    spec = next(m for m in margins if fnmatch.fnmatchcase(entry["metric"], m["metric"])) if "margin" not in entry \
        else {"margin": entry["margin"]}
    theirs = np.mean([values["theirs"][s] for s in seeds])
    margin = spec["margin"] if "margin" in spec else spec["relative"] * abs(theirs)
    se = d.std(ddof=1) / math.sqrt(len(d))
    if se == 0:
        return abs(d.mean()) <= margin
    low = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    high = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return max(low, high) < 0.025


def _num_eq(a, b) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def _positive_rows():
    """(reference entry, its folder, the file's margins, table name or '', verdict) for every positive row."""
    judged = {}
    for loaded in rs.load_all(rs.EXPERIMENTS_DIR).values():
        for f in loaded:
            if f["format"] == 2:
                for j in rs.judge_file(f, rs.RESULTS_DIR):
                    judged[(f["path"], j.verdict.id, j.table)] = j.verdict.verdict
    for (path, ident, table), verdict in judged.items():
        if verdict.startswith(("reproduces", "matches")):
            data = yaml.safe_load(path.read_text())
            entry = next(e for e in data["references"] if e["id"] == ident)
            yield pytest.param(entry, path.parent, data.get("margins", []), table, id=f"{path.parent.name}:{ident}:{table}")


@pytest.mark.parametrize("entry, folder, margins, table", list(_positive_rows()))
def test_every_positive_verdict_survives_an_independent_recomputation(entry, folder, margins, table):
    if entry["kind"] == "claim":
        assert _claim_positive(entry, _side_table(folder, entry) if "csv" in entry else _table(table))
    elif entry["kind"] == "peer":
        assert _peer_positive(entry, folder, margins)
    else:  # a paper value: |ours - paper| within 2 combined standard errors (+ half a printed decimal)
        ours = _pick(_table(table), entry["row"], entry["metric"])
        printed = str(entry["printed"]).replace("%", "").replace("+/-", "±").replace("+-", "±").split("±")
        value = float(printed[0]) * entry.get("scale", 1)
        decimals = printed[0].strip().split(".")
        half = 0.5 * 10.0 ** -len(decimals[1]) * entry.get("scale", 1) if len(decimals) == 2 else 0.0
        se_ours = ours[1] if math.isfinite(ours[1]) else 0.0
        if len(printed) == 2:
            n = entry["error"].get("n", 1) if entry["error"]["kind"] == "std" else 1
            allowed = 2 * math.hypot(float(printed[1]) * entry.get("scale", 1) / math.sqrt(n), se_ours) + half
        else:
            allowed = entry["tolerance"] + 2 * se_ours + half
        assert abs(ours[0] - value) <= allowed


def test_the_recomputation_rejects_what_the_rules_reject():
    table = {(("m", "a"),): {"x": (0.020, 0.001, 5)}, (("m", "b"),): {"x": (0.0215, 0.001, 5)},
             (("m", "c"),): {"x": (0.010, 0.001, 5)}}
    claim = {"op": ">=", "lhs": {"row": {"m": "b"}, "metric": "x"}, "rhs": {"row": {"m": "a"}, "metric": "x"}}
    assert not _claim_positive(claim, table)            # within noise, even with >=
    assert _claim_positive(dict(claim, rhs={"row": {"m": "c"}, "metric": "x"}), table)
    assert _claim_positive(dict(claim, margin=0.005), table)  # non-inferiority: not worse by more than 0.005


def test_the_recomputation_reads_a_claim_on_one_side_of_a_peer_csv(tmp_path):
    (tmp_path / "p.csv").write_text("# made by hand\nside,seed,model,x\n"
                                    + "".join(f"{side},{s},{m},{v + s * 0.01}\n" for side, m, v in
                                              [("ours", "a", 1.0), ("ours", "b", 0.5), ("theirs", "a", 0.5),
                                               ("theirs", "b", 1.0)] for s in range(3)))
    claim = {"op": ">", "lhs": {"row": {"model": "a"}, "metric": "x"}, "rhs": {"row": {"model": "b"}, "metric": "x"},
             "csv": "p.csv"}
    assert _claim_positive(claim, _side_table(tmp_path, dict(claim, side="ours")))
    assert not _claim_positive(claim, _side_table(tmp_path, dict(claim, side="theirs")))
