"""Reference numbers of a paper table (``experiments/<folder>/reference.yaml``) and the verdicts
that compare a results table with them.

File format (see ``experiments/README.md``)::

    preset: redux_mnist                       # conf/experiment/<preset>.yaml it checks (or a list:
                                              # a preset and its _cpu sibling share one file)
    references:
      - {id: la_ece, kind: value, row: {method_name: la}, metric: test/la/ece, value: 0.0077,
         tolerance: 0.002, source: "...", order_group: ece}      # order_group optional
      - {id: la_calibrated, kind: claim, claim: "LA ECE < MAP ECE", op: "<", source: "...",
         lhs: {row: {method_name: la}, metric: test/la/ece}, rhs: {row: {method_name: map}, metric: test/map/ece}}

Each entry may also carry a free-text ``note``. A ``row`` picks the one results row whose
group-by values include it (subset match; numbers compare as numbers, so ``1`` matches ``1.0``).

Verdicts (``VERDICTS``):

- value: *reproduces* when ``|ours - value| <= tolerance + se`` (se = our standard error over
  seeds, 0 when n < 2); otherwise *same ordering* when it has an ``order_group`` whose entries
  are all run and our means order them as the reference values do; else *does not reproduce*.
- claim: ``lhs op rhs`` on our means: *reproduces* or *does not reproduce*.
- *not run*: a row or metric the table does not have (or has no finite value of).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

VERDICTS = ("reproduces", "same ordering", "does not reproduce", "not run")
KINDS = ("value", "claim")
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
TOP_KEYS = ("preset", "references")
FIELDS = {
    "value": {"required": ("id", "kind", "row", "metric", "value", "tolerance", "source"),
              "optional": ("order_group", "note")},
    "claim": {"required": ("id", "kind", "claim", "lhs", "op", "rhs", "source"), "optional": ("note",)},
}
SIDE_KEYS = ("row", "metric")

# A results row: group-by values (text) plus ``metric -> (mean, se, n)``.
Row = dict[str, Any]


class ReferenceFileError(ValueError):
    """A malformed reference file; the message names the file, the entry id and the field."""


@dataclass
class Verdict:
    id: str
    metric: str      # what is compared (metric and row)
    reference: str   # the paper's number (+- tolerance) or the claim
    ours: str        # our mean +- se (n), or the two means of a claim
    verdict: str     # one of VERDICTS
    source: str


def _fail(path: Path, entry: str, message: str) -> None:
    raise ReferenceFileError(f"{path}: {entry}: {message}")


def _check_row(path: Path, where: str, row: Any) -> None:
    if not isinstance(row, dict) or not row:
        _fail(path, where, f"`row` must be a non-empty mapping of group-by key -> value, got {row!r}")
    for key, value in row.items():
        if not isinstance(key, str) or isinstance(value, (dict, list)) or value is None:
            _fail(path, where, f"`row` entry {key!r}: {value!r} must map a key to a single value")


def _check_metric(path: Path, where: str, metric: Any) -> None:
    if not isinstance(metric, str) or not metric:
        _fail(path, where, f"`metric` must be a metric name such as test/la/nll, got {metric!r}")


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_entry(path: Path, index: int, entry: Any, seen: set[str]) -> None:
    if not isinstance(entry, dict):
        _fail(path, f"entry #{index}", f"must be a mapping, got {entry!r}")
    ident = entry.get("id")
    where = f"entry {ident!r}" if isinstance(ident, str) and ident else f"entry #{index}"
    if not isinstance(ident, str) or not ident:
        _fail(path, where, f"field `id` must be a non-empty string, got {ident!r}")
    if ident in seen:
        _fail(path, where, "field `id` is used twice (ids must be unique within a file)")
    seen.add(ident)
    kind = entry.get("kind")
    if kind not in KINDS:
        _fail(path, where, f"field `kind`={kind!r} is not supported; allowed: {list(KINDS)}")
    spec = FIELDS[kind]
    missing = [k for k in spec["required"] if k not in entry]
    if missing:
        _fail(path, where, f"missing field(s) {missing} for kind {kind!r}")
    unknown = sorted(set(entry) - set(spec["required"]) - set(spec["optional"]))
    if unknown:
        _fail(path, where, f"unknown field(s) {unknown} for kind {kind!r}; allowed: "
                           f"{list(spec['required']) + list(spec['optional'])}")
    if not isinstance(entry["source"], str) or not entry["source"].strip():
        _fail(path, where, "field `source` must name the paper's table/figure or the authors' repository and file")
    if kind == "value":
        _check_row(path, where, entry["row"])
        _check_metric(path, where, entry["metric"])
        if not _finite_number(entry["value"]):
            _fail(path, where, f"field `value` must be a finite number, got {entry['value']!r}")
        if not _finite_number(entry["tolerance"]) or entry["tolerance"] < 0:
            _fail(path, where, f"field `tolerance` must be a finite number >= 0, got {entry['tolerance']!r}")
        if "order_group" in entry and (not isinstance(entry["order_group"], str) or not entry["order_group"]):
            _fail(path, where, f"field `order_group` must be a non-empty string, got {entry['order_group']!r}")
    else:
        if not isinstance(entry["claim"], str) or not entry["claim"].strip():
            _fail(path, where, f"field `claim` must state the claim as text, got {entry['claim']!r}")
        if entry["op"] not in OPS:
            _fail(path, where, f"field `op`={entry['op']!r} is not supported; allowed: {list(OPS)}")
        for side in ("lhs", "rhs"):
            value = entry[side]
            if not isinstance(value, dict) or sorted(value) != sorted(SIDE_KEYS):
                _fail(path, where, f"field `{side}` must be a mapping with exactly {list(SIDE_KEYS)}, got {value!r}")
            _check_row(path, f"{where}, field `{side}`", value["row"])
            _check_metric(path, f"{where}, field `{side}`", value["metric"])


def load_reference(path: str | Path) -> dict[str, Any]:
    """The validated file as ``{"presets", "preset", "references", "path"}`` (``presets``: the tuple
    of presets it checks, ``preset`` the first); a ``ReferenceFileError`` otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ReferenceFileError(f"{path}: cannot be read ({err})") from err
    except yaml.YAMLError as err:
        raise ReferenceFileError(f"{path}: is not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise ReferenceFileError(f"{path}: must be a mapping with keys {list(TOP_KEYS)}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ReferenceFileError(f"{path}: unknown top-level key(s) {unknown}; allowed: {list(TOP_KEYS)}")
    presets = data.get("preset")
    presets = [presets] if isinstance(presets, str) else presets
    if not isinstance(presets, list) or not presets or not all(isinstance(p, str) and p for p in presets):
        raise ReferenceFileError(f"{path}: field `preset` must name conf/experiment/<preset>.yaml (or be a "
                                 f"list of such names), got {data.get('preset')!r}")
    refs = data.get("references")
    if not isinstance(refs, list) or not refs:
        raise ReferenceFileError(f"{path}: field `references` must be a non-empty list of entries")
    seen: set[str] = set()
    for i, entry in enumerate(refs):
        _check_entry(path, i, entry, seen)
    return {"presets": tuple(presets), "preset": presets[0], "references": refs, "path": path}


def find_references(preset: str, experiments_dir: str | Path) -> list[dict[str, Any]]:
    """Every validated ``<experiments_dir>/*/reference*.yaml`` whose ``preset`` names ``preset``."""
    files = [load_reference(p) for p in sorted(Path(experiments_dir).glob("*/reference*.yaml"))]
    return [f for f in files if preset in f["presets"]]


def _same(a: Any, b: Any) -> bool:
    """Equal as numbers when both parse as numbers (``1`` == ``1.0``), else as text."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def _label(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items())


def find_row(rows: list[Row], group_by: list[str], want: dict[str, Any], where: str) -> Row | None:
    """The one row whose group-by values include ``want``; None when no row matches.

    A key of ``want`` that is not a group-by key, or a ``want`` that matches several rows, is a
    ``ReferenceFileError`` (the reference cannot be judged against this table)."""
    extra = [k for k in want if k not in group_by]
    if extra:
        raise ReferenceFileError(f"{where}: row key(s) {extra} are not group-by keys of the table; allowed: {group_by}")
    hits = [r for r in rows if all(_same(r[k], v) for k, v in want.items())]
    if len(hits) > 1:
        labels = "; ".join(_label({k: r[k] for k in group_by}) for r in hits)
        raise ReferenceFileError(f"{where}: row {{{_label(want)}}} matches {len(hits)} rows ({labels}); "
                             "add group-by keys to pick one")
    return hits[0] if hits else None


def ours(rows: list[Row], group_by: list[str], side: dict[str, Any], where: str) -> tuple[float, float, int] | None:
    """(mean, se, n) of ``side['metric']`` in the row ``side['row']``; None when not run."""
    row = find_row(rows, group_by, side["row"], where)
    if row is None or side["metric"] not in row:
        return None
    mean, se, n = row[side["metric"]]
    return (mean, se, n) if n > 0 and math.isfinite(mean) else None


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def _ours_text(stat: tuple[float, float, int] | None) -> str:
    if stat is None:
        return "-"
    mean, se, n = stat
    return f"{_fmt(mean)} ± {_fmt(se)} (n={n})" if n > 1 and math.isfinite(se) else f"{_fmt(mean)} (n={n})"


def value_reproduces(mean: float, se: float, value: float, tolerance: float) -> bool:
    """``|mean - value| <= tolerance + se`` (se counts as 0 when not finite, e.g. n = 1)."""
    return abs(mean - value) <= tolerance + (se if math.isfinite(se) else 0.0)


def same_ordering(pairs: list[tuple[float, float]]) -> bool:
    """True when every pair of (reference, ours) is ordered alike (reference ties are not judged)."""
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            ref = pairs[i][0] - pairs[j][0]
            if ref and (pairs[i][1] - pairs[j][1]) * ref <= 0:
                return False
    return True


def verdicts(references: list[dict[str, Any]], rows: list[Row], group_by: list[str]) -> list[Verdict]:
    """One ``Verdict`` per entry of the validated ``references`` (entries of one or more files)."""
    stats: dict[int, tuple[float, float, int] | None] = {}
    for i, e in enumerate(references):
        if e["kind"] == "value":
            stats[i] = ours(rows, group_by, e, f"reference entry {e['id']!r}")
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(references):
        if e["kind"] == "value" and e.get("order_group"):
            groups.setdefault(e["order_group"], []).append(i)
    ordered = {g: len(ix) > 1 and all(stats[i] is not None for i in ix)
               and same_ordering([(references[i]["value"], stats[i][0]) for i in ix]) for g, ix in groups.items()}
    out = []
    for i, e in enumerate(references):
        if e["kind"] == "value":
            stat = stats[i]
            if stat is None:
                verdict = "not run"
            elif value_reproduces(stat[0], stat[1], e["value"], e["tolerance"]):
                verdict = "reproduces"
            elif ordered.get(e.get("order_group"), False):
                verdict = "same ordering"
            else:
                verdict = "does not reproduce"
            group = f"; order group {e['order_group']}" if e.get("order_group") else ""
            out.append(Verdict(e["id"], f"{e['metric']} [{_label(e['row'])}]",
                               f"{_fmt(e['value'])} ± {_fmt(e['tolerance'])}{group}", _ours_text(stat), verdict,
                               e["source"]))
        else:
            where = f"reference entry {e['id']!r}"
            lhs, rhs = (ours(rows, group_by, e[s], f"{where}, field `{s}`") for s in ("lhs", "rhs"))
            if lhs is None or rhs is None:
                verdict = "not run"
            else:
                verdict = "reproduces" if OPS[e["op"]](lhs[0], rhs[0]) else "does not reproduce"
            metric = (f"{e['lhs']['metric']} [{_label(e['lhs']['row'])}] {e['op']} "
                      f"{e['rhs']['metric']} [{_label(e['rhs']['row'])}]")
            out.append(Verdict(e["id"], metric, e["claim"], f"{_ours_text(lhs)} vs {_ours_text(rhs)}", verdict,
                               e["source"]))
    return out


def to_markdown(results: list[Verdict], files: list[str]) -> list[str]:
    """Markdown lines of the "Reference numbers" section (``files``: the reference files, as shown)."""
    counts = ", ".join(f"{sum(v.verdict == k for v in results)} {k}" for k in VERDICTS)
    lines = ["", "## Reference numbers", "",
             f"From {', '.join(f'`{f}`' for f in files)}; verdicts computed by `laplace_lab.reporting.reference`. "
             "A value *reproduces* when |ours - reference| <= tolerance + our standard error over seeds "
             "(0 when n = 1); one that misses is *same ordering* when every entry of its order group ran and "
             "our means rank them as the reference does. A claim is judged on our means. *not run*: the table "
             f"has no such row or metric. Totals: {counts}.", "",
             "| metric | reference | ours | verdict | source |", "|---|---|---|---|---|"]
    for v in results:
        cells = [f"{v.metric} ({v.id})", v.reference, v.ours, f"**{v.verdict}**", v.source]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines
