"""Reference numbers of a paper table (``experiments/<folder>/reference*.yaml``) and the verdicts
that compare a results table with them. Format and verdicts: ``experiments/README.md``.

Two file formats. ``format: 2`` (the one to write) has three kinds of entries:

- ``paper``: a number printed in the paper, with a traced ``source`` (paper, table/figure, row,
  column, where it was read) and the cell as printed (``printed``, e.g. ``"58.8±1.2"``; ``scale``
  turns its units into our metric's). Judged on the paper's own error bar (``error``: the printed
  ± is a std over ``n`` runs or a standard error) or, where it prints none, on a stated
  ``tolerance`` with its ``tolerance_reason``: *reproduces* when |ours - paper| <=
  2 sqrt(se_paper^2 + se_ours^2) (error bar) or tolerance + 2 se_ours (stated), plus half a unit
  of the printed cell's last digit.
- ``peer``: ours vs the authors' code run here, seed by seed, from a CSV beside the file
  (``laplace_lab.reporting.peer_pairs``): *matches the authors' code* when |mean(ours - theirs)| <= 2 paired
  standard errors (+ a stated tolerance).
- ``claim``: an ordering the paper states in words (``quote``: the sentence), ``lhs op rhs`` on our
  means: *reproduces* when it holds by more than 2 combined standard errors, *within noise* when
  the difference is inside them (for ``<=`` / ``>=`` that is consistent with the claim:
  *reproduces*), else *does not reproduce*. A claim comparing a row and metric with itself is refused.
  With ``csv`` (a peer CSV declared in ``peers``) and ``side`` (``ours`` or ``theirs``), the two
  means are those of that side's rows of the CSV over seeds instead of the table's (the same claim
  judged on the authors' code, or on our runs of the peer's candidates); judged once, like a peer row.

The file also names the ``paper``, optionally the committed ``tables`` it judges (default: its
presets) and the paper's ``headline`` claims (one line each, with the entry ids that test them),
which ``laplace_lab.reporting.results_summary`` lists in ``results/README.md``.

Files without ``format`` are the first format (``value`` and ``claim`` entries, free-text sources):
still read and judged as before (a ``value`` *reproduces* when ``|ours - value| <= tolerance + se``,
else *same ordering* when its ``order_group`` ranks alike), and listed as untraced in the summary.

Every kind is *not run* when the table (or the peer CSV) lacks the row or metric; the verdict says
why, and an entry's ``not_run_reason`` says why it cannot run here (e.g. a data set not available).
"""

from __future__ import annotations

import fnmatch
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from laplace_lab.reporting import peer_pairs
from laplace_lab.reporting import verdict_rules as rules
from laplace_lab.reporting.summary_stats import mean_se
from laplace_lab.reporting.verdict_rules import (
    CHECK,
    FAILS,
    INCONCLUSIVE,
    MISSES,
    NOT_RUN,
    REPRODUCES,
)

# whose code a peer CSV ran (``peers:`` of a format-2 file) -> the verdict of a row that matches it
PEER_CODES = {"authors": "matches the authors' code", "laplace-torch": "matches laplace-torch (same recipe)"}
MATCHES, MATCHES_LAPLACE_TORCH = PEER_CODES["authors"], PEER_CODES["laplace-torch"]
RETIRED = "retired"
VERDICTS = (REPRODUCES, MATCHES, MATCHES_LAPLACE_TORCH, INCONCLUSIVE, MISSES, FAILS, NOT_RUN, CHECK, RETIRED,
            # the first format's verdicts (cifar10's files): not counted by results_summary
            "reproduces", "same ordering", "does not reproduce")
FORMATS = (1, 2)
KINDS = {1: ("value", "claim"), 2: ("paper", "peer", "claim")}
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
TOP_KEYS = {1: ("preset", "references"),
            2: ("format", "preset", "paper", "tables", "headline", "findings", "peers", "margins", "retired",
                "references")}
FIELDS = {
    1: {"value": {"required": ("id", "kind", "row", "metric", "value", "tolerance", "source"),
                  "optional": ("order_group", "note")},
        "claim": {"required": ("id", "kind", "claim", "lhs", "op", "rhs", "source"), "optional": ("note",)}},
    2: {"paper": {"required": ("id", "kind", "row", "metric", "printed", "source"),
                  "optional": ("scale", "error", "tolerance", "tolerance_reason", "note", "not_run_reason")},
        "peer": {"required": ("id", "kind", "csv", "row", "metric", "source"),
                 "optional": ("margin", "margin_reason", "check", "note", "not_run_reason")},
        "claim": {"required": ("id", "kind", "claim", "quote", "lhs", "op", "rhs", "source"),
                  "optional": ("margin", "margin_reason", "note", "not_run_reason", "csv", "side")}},
}
SIDE_KEYS = ("row", "metric")
SOURCE_KEYS = {"required": ("paper", "where", "read_from"), "optional": ("row", "column", "cross_check")}
ERROR_KINDS = ("std", "se")
# the printed cell: a number, optionally "± number" (also "+-", "+/-"), optionally a trailing "%"
PRINTED = re.compile(r"^\s*(?P<value>[-+]?(?:\d+\.?\d*|\.\d+))\s*(?:(?:±|\+-|\+/-)\s*(?P<error>\d+\.?\d*|\.\d+))?"
                     r"\s*%?\s*$")

# A results row: group-by values (text) plus ``metric -> (mean, se, n)``.
Row = dict[str, Any]


class ReferenceFileError(ValueError):
    """A malformed reference file; the message names the file, the entry id and the field."""


@dataclass
class Verdict:
    id: str
    metric: str      # what is compared (metric and row)
    reference: str   # the paper's number (+- tolerance), the claim, or the authors' code
    ours: str        # our mean +- se (n), the two means of a claim, or the paired difference
    verdict: str     # one of VERDICTS
    source: str
    kind: str = "value"
    why: str = ""    # why it is not run (empty otherwise): what is missing, then the entry's not_run_reason
    reason: str = ""  # the entry's not_run_reason (when not run), for grouping
    side: str = ""    # a claim judged on one side of a peer CSV: "ours" or "theirs" ("" otherwise)


def _fail(path: Path, entry: str, message: str) -> None:
    raise ReferenceFileError(f"{path}: {entry}: {message}")


def _check_row(path: Path, where: str, row: Any, allow_empty: bool = False) -> None:
    if not isinstance(row, dict) or (not row and not allow_empty):
        _fail(path, where, f"`row` must be a non-empty mapping of group-by key -> value, got {row!r}")
    for key, value in row.items():
        if not isinstance(key, str) or isinstance(value, (dict, list)) or value is None:
            _fail(path, where, f"`row` entry {key!r}: {value!r} must map a key to a single value")


def _check_metric(path: Path, where: str, metric: Any) -> None:
    if not isinstance(metric, str) or not metric:
        _fail(path, where, f"`metric` must be a metric name such as test/la/nll, got {metric!r}")


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def parse_printed(text: str) -> tuple[float, float | None, float]:
    """(value, error or None, half a unit of the value's last printed digit) of a printed cell such
    as ``"58.8±1.2"`` (no half unit for a value printed without decimals); a ValueError for anything else."""
    match = PRINTED.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a printed number such as '58.8', '58.8±1.2' or '0.31 +- 0.02'")
    error = float(match["error"]) if match["error"] is not None else None
    return float(match["value"]), error, rules.half_unit(match["value"])


def _check_source(path: Path, where: str, source: Any, needs_cell: bool) -> None:
    allowed = SOURCE_KEYS["required"] + SOURCE_KEYS["optional"]
    if not isinstance(source, dict):
        _fail(path, where, f"field `source` must be a mapping with {list(SOURCE_KEYS['required'])} (and "
                           f"{list(SOURCE_KEYS['optional'])}), got {source!r}")
    missing = [k for k in SOURCE_KEYS["required"] if not _text(source.get(k))]
    unknown = sorted(set(source) - set(allowed))
    if unknown:
        _fail(path, where, f"field `source` has unknown key(s) {unknown}; allowed: {allowed}")
    if missing:
        _fail(path, where, f"field `source` needs non-empty {missing} (the paper; its table, figure or section; "
                           "where it was read)")
    if needs_cell and str(source["where"]).lower().startswith("table"):
        for key in ("row", "column"):
            if not _text(source.get(key)):
                _fail(path, where, f"field `source` of a table value needs `{key}` (the table's {key} as printed)")


def _check_tolerance(path: Path, where: str, entry: dict) -> None:
    if not _finite_number(entry["tolerance"]) or entry["tolerance"] < 0:
        _fail(path, where, f"field `tolerance` must be a finite number >= 0, got {entry['tolerance']!r}")
    if not _text(entry.get("tolerance_reason")):
        _fail(path, where, "field `tolerance` needs `tolerance_reason` (why this tolerance)")


def _check_paper(path: Path, where: str, entry: dict) -> None:
    _check_source(path, where, entry["source"], needs_cell=True)
    try:
        _, error, _ = parse_printed(entry["printed"])
    except ValueError as err:
        _fail(path, where, f"field `printed`: {err}")
    scale = entry.get("scale", 1)
    if not _finite_number(scale) or scale <= 0:
        _fail(path, where, f"field `scale` must be a finite number > 0 (printed units -> metric units), got {scale!r}")
    if error is not None:
        if "tolerance" in entry or "tolerance_reason" in entry:
            _fail(path, where, "field `tolerance`: the printed cell has an error bar (±): judge on it with "
                               "`error`, not a stated tolerance")
        err = entry.get("error")
        if not isinstance(err, dict) or err.get("kind") not in ERROR_KINDS:
            _fail(path, where, f"field `error` must say what the printed ± is: {{kind: std, n: <runs>}} or "
                               f"{{kind: se}}; allowed kinds: {list(ERROR_KINDS)}, got {err!r}")
        unknown = sorted(set(err) - {"kind", "n"})
        if unknown:
            _fail(path, where, f"field `error` has unknown key(s) {unknown}; allowed: ['kind', 'n']")
        if err["kind"] == "std" and not (isinstance(err.get("n"), int) and not isinstance(err.get("n"), bool)
                                         and err["n"] >= 1):
            _fail(path, where, f"field `error`: a std needs `n`, the number of runs it is over, got {err.get('n')!r}")
    else:
        if "error" in entry:
            _fail(path, where, "field `error`: the printed cell has no ± to describe; give `tolerance` and "
                               "`tolerance_reason` instead")
        if "tolerance" not in entry:
            _fail(path, where, "field `tolerance`: the printed cell has no error bar, so a stated `tolerance` "
                               "(metric units) with its `tolerance_reason` is required")
        _check_tolerance(path, where, entry)


def _check_margin(path: Path, where: str, entry: dict) -> None:
    """An entry's own equivalence / non-inferiority ``margin`` (metric units) and its reason."""
    if "margin" not in entry:
        if "margin_reason" in entry:
            _fail(path, where, "field `margin_reason` without `margin`")
        return
    if not _finite_number(entry["margin"]) or entry["margin"] < 0:
        _fail(path, where, f"field `margin` must be a finite number >= 0 (metric units), got {entry['margin']!r}")
    if not _text(entry.get("margin_reason")):
        _fail(path, where, "field `margin` needs `margin_reason` (why this margin, fixed before looking)")


def _check_csv_path(path: Path, where: str, csv_path: Any) -> None:
    if not _text(csv_path) or Path(csv_path).is_absolute() or ".." in Path(csv_path).parts:
        _fail(path, where, f"field `csv` must be a path relative to the reference file's folder, inside it "
                           f"(e.g. peer/authors.csv), got {csv_path!r}")


def _check_peer(path: Path, where: str, entry: dict) -> None:
    if not _text(entry["source"]):
        _fail(path, where, "field `source` must name the peer's code and what was run")
    _check_row(path, where, entry["row"], allow_empty=True)
    _check_csv_path(path, where, entry["csv"])
    _check_margin(path, where, entry)
    if "check" in entry and not _text(entry["check"]):
        _fail(path, where, "field `check` must say why both sides run the same network through the same code "
                           "path (a check, never counted)")
    try:
        table = peer_pairs.read_peer_csv(path.parent / entry["csv"])
        peer_pairs.side_values(table, entry["row"], entry["metric"], f"reference entry {entry['id']!r}")
    except peer_pairs.PeerCSVError as err:
        _fail(path, f"{where}, field `csv`", str(err))


def _check_claim(path: Path, where: str, entry: dict, fmt: int) -> None:
    if not _text(entry["claim"]):
        _fail(path, where, f"field `claim` must state the claim as text, got {entry['claim']!r}")
    if entry["op"] not in OPS:
        _fail(path, where, f"field `op`={entry['op']!r} is not supported; allowed: {list(OPS)}")
    for side in ("lhs", "rhs"):
        value = entry[side]
        if not isinstance(value, dict) or sorted(value) != sorted(SIDE_KEYS):
            _fail(path, where, f"field `{side}` must be a mapping with exactly {list(SIDE_KEYS)}, got {value!r}")
        _check_row(path, f"{where}, field `{side}`", value["row"])
        _check_metric(path, f"{where}, field `{side}`", value["metric"])
    if fmt == 2:
        _check_margin(path, where, entry)
        if "margin" in entry and entry["op"] not in ("<=", ">="):
            _fail(path, where, f"field `margin` makes a non-inferiority claim, which needs `op` <= or >=; got "
                               f"{entry['op']!r}")
        if not _text(entry["quote"]):
            _fail(path, where, "field `quote` must be the paper's sentence that states this ordering")
        _check_source(path, where, entry["source"], needs_cell=False)
        if entry["lhs"] == entry["rhs"]:
            _fail(path, where, "fields `lhs` and `rhs` are the same row and metric: the claim compares a "
                               "configuration with itself")
    if ("csv" in entry) != ("side" in entry):
        _fail(path, where, "fields `csv` and `side` go together: a claim on a peer CSV names the CSV and the side "
                           f"whose rows it judges ({' | '.join(peer_pairs.SIDES)})")
    if "csv" in entry:
        _check_csv_claim(path, where, entry)


def _check_csv_claim(path: Path, where: str, entry: dict) -> None:
    """A claim judged on one side of a peer CSV: a known side; rows and metrics that are columns."""
    _check_csv_path(path, where, entry["csv"])
    if entry["side"] not in peer_pairs.SIDES:
        _fail(path, where, f"field `side`={entry['side']!r} is not allowed; allowed: {list(peer_pairs.SIDES)}")
    try:
        table = peer_pairs.read_peer_csv(path.parent / entry["csv"])
        for side in ("lhs", "rhs"):
            peer_pairs.side_values(table, entry[side]["row"], entry[side]["metric"],
                                   f"reference entry {entry['id']!r}, field `{side}`")
    except peer_pairs.PeerCSVError as err:
        _fail(path, f"{where}, field `csv`", str(err))


def _check_entry(path: Path, index: int, entry: Any, seen: set[str], fmt: int) -> None:
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
    if kind not in KINDS[fmt]:
        hint = " (`value` is the first format's kind: write `paper` or `peer`)" if fmt == 2 and kind == "value" else ""
        _fail(path, where, f"field `kind`={kind!r} is not supported in format {fmt}; allowed: {list(KINDS[fmt])}"
                           + hint)
    spec = FIELDS[fmt][kind]
    missing = [k for k in spec["required"] if k not in entry]
    if missing:
        _fail(path, where, f"missing field(s) {missing} for kind {kind!r}")
    unknown = sorted(set(entry) - set(spec["required"]) - set(spec["optional"]))
    if kind == "peer" and {"tolerance", "tolerance_reason"} & set(entry):
        _fail(path, where, "field `tolerance`: a peer row is an equivalence test: give `margin` and "
                           "`margin_reason` (or a `margins` pattern at the top of the file)")
    if unknown:
        _fail(path, where, f"unknown field(s) {unknown} for kind {kind!r}; allowed: "
                           f"{list(spec['required']) + list(spec['optional'])}")
    for key in ("note", "not_run_reason"):
        if key in entry and not _text(entry[key]):
            _fail(path, where, f"field `{key}` must be non-empty text, got {entry[key]!r}")
    if kind in ("value", "paper", "peer"):
        if kind != "peer":
            _check_row(path, where, entry["row"])
        _check_metric(path, where, entry["metric"])
    if kind == "claim":
        _check_claim(path, where, entry, fmt)
    elif kind == "paper":
        _check_paper(path, where, entry)
    elif kind == "peer":
        _check_peer(path, where, entry)
    else:
        if not _text(entry["source"]):
            _fail(path, where, "field `source` must name the paper's table/figure or the authors' repository and file")
        if not _finite_number(entry["value"]):
            _fail(path, where, f"field `value` must be a finite number, got {entry['value']!r}")
        if not _finite_number(entry["tolerance"]) or entry["tolerance"] < 0:
            _fail(path, where, f"field `tolerance` must be a finite number >= 0, got {entry['tolerance']!r}")
        if "order_group" in entry and (not isinstance(entry["order_group"], str) or not entry["order_group"]):
            _fail(path, where, f"field `order_group` must be a non-empty string, got {entry['order_group']!r}")


def _names(path: Path, data: dict, key: str, what: str) -> list[str]:
    value = data.get(key)
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p for p in value):
        raise ReferenceFileError(f"{path}: field `{key}` must name {what} (or be a list of such names), "
                                 f"got {data.get(key)!r}")
    return value


def _check_headline(path: Path, headline: Any, ids: set[str]) -> list[dict]:
    if not isinstance(headline, list) or not headline:
        raise ReferenceFileError(f"{path}: field `headline` must be a non-empty list of {{claim, ids}}")
    for i, item in enumerate(headline):
        where = f"{path}: field `headline` item #{i}"
        if not isinstance(item, dict) or sorted(item) != ["claim", "ids"] or not _text(item["claim"]):
            raise ReferenceFileError(f"{where}: must be a mapping with exactly `claim` (one line) and `ids`, got {item!r}")
        if not isinstance(item["ids"], list) or not item["ids"]:
            raise ReferenceFileError(f"{where}: `ids` must be a non-empty list of entry ids")
        unknown = [x for x in item["ids"] if x not in ids]
        if unknown:
            raise ReferenceFileError(f"{where}: `ids` {unknown} are not entries of this file")
    return headline


def _check_peers(path: Path, peers: Any) -> dict[str, dict]:
    """``peers``: peer CSV (relative path) -> {code: authors | laplace-torch, what: what ran}."""
    if not isinstance(peers, dict) or not peers:
        raise ReferenceFileError(f"{path}: field `peers` must map each peer CSV to {{code, what}}, got {peers!r}")
    for csv_path, spec in peers.items():
        where = f"{path}: field `peers` entry {csv_path!r}"
        if not isinstance(spec, dict) or sorted(spec) != ["code", "what"]:
            raise ReferenceFileError(f"{where}: must be a mapping with exactly `code` and `what`, got {spec!r}")
        if spec["code"] not in PEER_CODES:
            raise ReferenceFileError(f"{where}: `code`={spec['code']!r} is not allowed; allowed: {list(PEER_CODES)} "
                                     "(\"authors\": their repository ran end to end)")
        if not _text(spec["what"]):
            raise ReferenceFileError(f"{where}: `what` must say what ran (repository, commit, recipe)")
    return peers


def _check_margins(path: Path, margins: Any) -> list[dict]:
    """``margins``: [{metric: fnmatch pattern, margin: metric units >= 0 | relative: fraction of |the
    peer's mean| > 0, reason: why}], the first pattern that matches a metric wins."""
    if not isinstance(margins, list) or not margins:
        raise ReferenceFileError(f"{path}: field `margins` must be a non-empty list of {{metric, margin, reason}}")
    for i, item in enumerate(margins):
        where = f"{path}: field `margins` item #{i}"
        if not isinstance(item, dict) or sorted(item) not in (["margin", "metric", "reason"],
                                                              ["metric", "reason", "relative"]):
            raise ReferenceFileError(f"{where}: must be a mapping with exactly `metric`, `reason` and one of "
                                     f"`margin` (metric units) or `relative` (fraction of the peer's mean), got {item!r}")
        if not _text(item["metric"]) or not _text(item["reason"]):
            raise ReferenceFileError(f"{where}: `metric` (a pattern such as test/*/nll) and `reason` must be text")
        value = item.get("margin", item.get("relative"))
        if not _finite_number(value) or value < 0 or ("relative" in item and not 0 < value < 1):
            raise ReferenceFileError(f"{where}: `margin` must be a finite number >= 0, `relative` a fraction in "
                                     f"(0, 1); got {value!r}")
    return margins


def _check_retired(path: Path, retired: Any, ids: set[str]) -> list[dict]:
    """``retired``: rows taken out of the judgement, each [{id, what, reason}], shown in the tables."""
    if not isinstance(retired, list) or not retired:
        raise ReferenceFileError(f"{path}: field `retired` must be a non-empty list of {{id, what, reason}}")
    for i, item in enumerate(retired):
        where = f"{path}: field `retired` item #{i}"
        if not isinstance(item, dict) or sorted(item) != ["id", "reason", "what"] or not all(
                _text(item[k]) for k in item):
            raise ReferenceFileError(f"{where}: must be a mapping with exactly non-empty `id`, `what` (the row "
                                     f"as it was) and `reason` (why it no longer counts), got {item!r}")
        if item["id"] in ids:
            raise ReferenceFileError(f"{where}: id {item['id']!r} is also an entry of `references`")
    return retired


def entry_margin(entry: dict, margins: list[dict] | None) -> tuple[float, str, bool] | None:
    """(margin, reason, relative) of an entry: its own ``margin``, else the first ``margins`` pattern
    that matches its metric (``relative``: the margin is that fraction of |the peer's mean|); None
    when neither gives one."""
    if "margin" in entry:
        return entry["margin"], entry["margin_reason"], False
    for item in margins or ():
        if fnmatch.fnmatchcase(entry["metric"], item["metric"]):
            return item.get("margin", item.get("relative")), item["reason"], "relative" in item
    return None


def _attach_peer_specs(path: Path, refs: list[dict], peers: dict | None, margins: list[dict] | None) -> None:
    """Give each entry that reads a peer CSV its code (``_code``: a key of PEER_CODES) and each peer
    entry its margin (``_margin``)."""
    for entry in refs:
        if "csv" not in entry:
            continue
        where = f"entry {entry['id']!r}"
        if peers is None or entry["csv"] not in peers:
            _fail(path, where, f"field `csv` {entry['csv']!r} is not declared in the top-level `peers` "
                               f"(csv: {{code: {' | '.join(PEER_CODES)}, what: ...}})")
        if entry["kind"] != "peer":
            entry["_code"] = peers[entry["csv"]]["code"]
            continue
        margin = entry_margin(entry, margins)
        if margin is None:
            _fail(path, where, f"no equivalence margin for metric {entry['metric']!r}: give `margin` and "
                               "`margin_reason`, or a top-level `margins` pattern that matches it")
        entry["_code"], entry["_margin"] = peers[entry["csv"]]["code"], margin


def load_reference(path: str | Path) -> dict[str, Any]:
    """The validated file as ``{"format", "presets", "preset", "tables", "paper", "headline",
    "references", "path"}`` (``presets``: the tuple of presets it checks, ``preset`` the first;
    ``tables``: the committed tables it judges; ``paper``/``headline``: None in format 1); a
    ``ReferenceFileError`` otherwise. Each entry gains ``_format`` and ``_file`` (this path)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ReferenceFileError(f"{path}: cannot be read ({err})") from err
    except yaml.YAMLError as err:
        raise ReferenceFileError(f"{path}: is not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise ReferenceFileError(f"{path}: must be a mapping with keys {list(TOP_KEYS[2])}")
    fmt = data.get("format", 1)
    if fmt not in FORMATS or isinstance(fmt, bool):
        raise ReferenceFileError(f"{path}: field `format`={fmt!r} is not supported; allowed: {list(FORMATS)}")
    unknown = sorted(set(data) - set(TOP_KEYS[fmt]))
    if unknown:
        raise ReferenceFileError(f"{path}: unknown top-level key(s) {unknown} in format {fmt}; allowed: "
                                 f"{list(TOP_KEYS[fmt])}")
    presets = _names(path, data, "preset", "experiments/<preset>/preset.yaml")
    tables = _names(path, data, "tables", "committed tables results/<name>.csv") if "tables" in data else presets
    if fmt == 2 and not _text(data.get("paper")):
        raise ReferenceFileError(f"{path}: field `paper` must cite the paper (authors, year, title, venue)")
    refs = data.get("references")
    if not isinstance(refs, list) or not refs:
        raise ReferenceFileError(f"{path}: field `references` must be a non-empty list of entries")
    seen: set[str] = set()
    for i, entry in enumerate(refs):
        _check_entry(path, i, entry, seen, fmt)
    headline = _check_headline(path, data["headline"], seen) if "headline" in data else None
    peers = _check_peers(path, data["peers"]) if "peers" in data else None
    margins = _check_margins(path, data["margins"]) if "margins" in data else None
    retired = _check_retired(path, data["retired"], seen) if "retired" in data else []
    findings = data.get("findings", [])
    if not isinstance(findings, list) or not all(_text(f) for f in findings):
        raise ReferenceFileError(f"{path}: field `findings` must be a list of sentences (what a reader must know "
                                 f"to read the verdicts), got {findings!r}")
    _attach_peer_specs(path, refs, peers, margins)
    for entry in refs:
        entry["_format"], entry["_file"] = fmt, path
        if entry["kind"] == "claim" and "margin" in entry:
            entry["_margin"] = (entry["margin"], entry["margin_reason"], False)
    return {"format": fmt, "presets": tuple(presets), "preset": presets[0], "tables": tuple(tables),
            "paper": data.get("paper"), "headline": headline, "references": refs, "path": path,
            "retired": retired, "findings": findings}


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


def csv_lookup(entry: dict[str, Any], side: dict[str, Any],
               where: str) -> tuple[tuple[float, float, int] | None, str]:
    """((mean, se, n) over seeds of ``side['metric']`` in the rows ``side['row']`` of the claim's peer
    CSV (``entry['csv']``) on its ``entry['side']``, ""), or (None, why not run)."""
    table = peer_pairs.read_peer_csv(Path(entry["_file"]).parent / entry["csv"])
    values = peer_pairs.side_values(table, side["row"], side["metric"], where)[entry["side"]]
    if not values:
        return None, f"{entry['csv']} has no side={entry['side']} row {{{_label(side['row'])}}} with {side['metric']}"
    return mean_se([values[s] for s in sorted(values)]), ""


def lookup(rows: list[Row], group_by: list[str], side: dict[str, Any],
           where: str) -> tuple[tuple[float, float, int] | None, str]:
    """((mean, se, n) of ``side['metric']`` in the row ``side['row']``, ""), or (None, why not run)."""
    row = find_row(rows, group_by, side["row"], where)
    if row is None:
        return None, f"the table has no row {{{_label(side['row'])}}}"
    if side["metric"] not in row:
        return None, f"the table has no column {side['metric']}"
    mean, se, n = row[side["metric"]]
    if n <= 0 or not math.isfinite(mean):
        return None, f"{side['metric']} has no finite value in row {{{_label(side['row'])}}}"
    return (mean, se, n), ""


def ours(rows: list[Row], group_by: list[str], side: dict[str, Any], where: str) -> tuple[float, float, int] | None:
    """(mean, se, n) of ``side['metric']`` in the row ``side['row']``; None when not run."""
    return lookup(rows, group_by, side, where)[0]


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


def paper_value(entry: dict[str, Any]) -> tuple[float, float | None, float]:
    """(value, standard error or None, rounding half-unit) of a ``paper`` entry, in metric units."""
    value, error, half = parse_printed(entry["printed"])
    scale = entry.get("scale", 1)
    if error is None:
        return value * scale, None, half * scale
    n = entry["error"].get("n", 1) if entry["error"]["kind"] == "std" else 1
    return value * scale, error * scale / math.sqrt(n), half * scale


def paper_tolerance(entry: dict[str, Any], our_se: float) -> float:
    """The allowed |ours - paper| of a ``paper`` entry given our standard error (0 when unknown)."""
    value, paper_se, half = paper_value(entry)
    return rules.paper_decision(value, our_se, value, paper_se, entry.get("tolerance"), half)[1]


def format_source(source: Any) -> str:
    """A source as one line of text (a format-2 mapping: paper, where, row, column, read from)."""
    if not isinstance(source, dict):
        return str(source)
    parts = [source["paper"], source["where"]]
    parts += [f"{k} {source[k]}" for k in ("row", "column") if source.get(k)]
    text = ", ".join(parts) + f"; read from {source['read_from']}"
    return text + (f"; cross-checked: {source['cross_check']}" if source.get("cross_check") else "")


def _not_run(e: dict[str, Any], why: str) -> str:
    return "; ".join(x for x in (why, e.get("not_run_reason", "")) if x)


def _paper_verdict(e: dict[str, Any], rows: list[Row], group_by: list[str]) -> Verdict:
    stat, why = lookup(rows, group_by, e, f"reference entry {e['id']!r}")
    value, paper_se, half = paper_value(e)
    err = f"{e['error']['kind']}" + (f", n={e['error']['n']}" if "n" in e["error"] else "") if "error" in e else ""
    scale = f" × {e['scale']}" if e.get("scale", 1) != 1 else ""
    described = f"{e['printed']}{' (' + err + ')' if err else ''}{scale} = {_fmt(value)}"
    if stat is None:
        return Verdict(e["id"], f"{e['metric']} [{_label(e['row'])}]", described, "-", NOT_RUN,
                       format_source(e["source"]), "paper", _not_run(e, why))
    verdict, tol = rules.paper_decision(stat[0], stat[1], value, paper_se, e.get("tolerance"), half)
    basis = "2 se (paper, ours)" if paper_se is not None else f"stated {_fmt(e['tolerance'])} + 2 se (ours)"
    return Verdict(e["id"], f"{e['metric']} [{_label(e['row'])}]", f"{described}; allowed ±{_fmt(tol)} ({basis})",
                   _ours_text(stat), verdict, format_source(e["source"]), "paper")


def _peer_verdict(e: dict[str, Any]) -> Verdict:
    where = f"reference entry {e['id']!r}"
    table = peer_pairs.read_peer_csv(Path(e["_file"]).parent / e["csv"])
    values = peer_pairs.side_values(table, e["row"], e["metric"], where)
    mean, se, n, seeds = peer_pairs.paired(values)
    label = f"{e['metric']} [{_label(e['row']) or 'all rows'}] vs {e['csv']}"
    theirs = [values["theirs"][s] for s in seeds]
    whose = "authors' code" if e["_code"] == "authors" else e["_code"]
    reference = f"{whose}: {_fmt(sum(theirs) / n)} (n={n})" if n else f"{whose}: -"
    if n == 0:
        why = (f"no paired seed (ours: {sorted(values['ours'])}, theirs: {sorted(values['theirs'])})")
        return Verdict(e["id"], label, reference, "-", NOT_RUN, e["source"], "peer", _not_run(e, why))
    margin, margin_reason, relative = e["_margin"]
    margin = margin * abs(sum(theirs) / n) if relative else margin
    differences = [values["ours"][s] - values["theirs"][s] for s in seeds]
    ours_text = f"ours - theirs: {_fmt(mean)} ± {_fmt(se)} (paired, n={n})"
    if "check" in e or rules.identical(differences, max(abs(t) for t in theirs)):
        why = e.get("check") or "identical on every seed (|d| < 1e-6): both sides computed the same thing"
        return Verdict(e["id"], label, reference, ours_text, CHECK, e["source"], "peer", why)
    verdict, how = rules.peer_decision(mean, se, n, margin, PEER_CODES[e["_code"]])
    return Verdict(e["id"], label, reference, f"{ours_text}; {how} ({margin_reason})", verdict, e["source"],
                   "peer")


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
        if e["kind"] == "paper":
            out.append(_paper_verdict(e, rows, group_by))
        elif e["kind"] == "peer":
            out.append(_peer_verdict(e))
        elif e["kind"] == "value":
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
            why = lookup(rows, group_by, e, f"reference entry {e['id']!r}")[1] if stat is None else ""
            out.append(Verdict(e["id"], f"{e['metric']} [{_label(e['row'])}]",
                               f"{_fmt(e['value'])} ± {_fmt(e['tolerance'])}{group}", _ours_text(stat), verdict,
                               e["source"], "value", why))
        else:
            where = f"reference entry {e['id']!r}"
            (lhs, why_l), (rhs, why_r) = (csv_lookup(e, e[s], f"{where}, field `{s}`") if "csv" in e
                                          else lookup(rows, group_by, e[s], f"{where}, field `{s}`") for s in ("lhs", "rhs"))
            why = ""
            if lhs is None or rhs is None:
                verdict, why = "not run", _not_run(e, "; ".join(dict.fromkeys(w for w in (why_l, why_r) if w)))
            elif e.get("_format", 1) == 2:
                margin = e.get("_margin", (0.0, "", False))
                verdict, how = rules.claim_decision(e["op"], lhs, rhs, margin[0])
                why = how + (f" ({margin[1]})" if margin[1] else "")
            else:
                verdict = "reproduces" if OPS[e["op"]](lhs[0], rhs[0]) else "does not reproduce"
            metric = (f"{e['lhs']['metric']} [{_label(e['lhs']['row'])}] {e['op']} "
                      f"{e['rhs']['metric']} [{_label(e['rhs']['row'])}]")
            if "csv" in e:
                metric += f" on side={e['side']} of {e['csv']}"
            reference = e["claim"] + (f' ("{e["quote"]}")' if e.get("quote") else "")
            out.append(Verdict(e["id"], metric, reference, f"{_ours_text(lhs)} vs {_ours_text(rhs)}", verdict,
                               format_source(e["source"]), "claim", why, side=e.get("side", "")))
    for v, e in zip(out, references):
        if v.verdict == NOT_RUN:
            v.reason = e.get("not_run_reason", "")
    return out


KIND_VERDICTS = {"value": ("reproduces", "same ordering", "does not reproduce"),
                 "paper": (REPRODUCES, MISSES), "peer": (MATCHES, MATCHES_LAPLACE_TORCH, INCONCLUSIVE, MISSES, CHECK),
                 "claim": (REPRODUCES, INCONCLUSIVE, FAILS)}
RULES = {
    "value": "A value (first format) *reproduces* when |ours - reference| <= tolerance + our standard error over "
             "seeds (0 when n = 1); one that misses is *same ordering* when every entry of its order group ran and "
             "our means rank them as the reference does.",
    "paper": "A paper value *reproduces the paper* when |ours - paper| <= 2 sqrt(se_paper^2 + se_ours^2) (the "
             "paper's printed error bar as a standard error; a std over n runs counts std / sqrt(n)) or, where the "
             "paper prints no error bar, <= the stated tolerance + 2 se_ours; plus half a unit of the printed "
             "cell's last decimal (none for a cell printed without decimals); otherwise it *misses*.",
    "peer": "A peer row pairs our runs and the peer's code (the authors' repository run end to end, or "
            "laplace-torch on our recipe: the file's `peers` says which), seed by seed: it *matches* when the 95% "
            "interval of the mean paired difference (Student's t at n - 1 degrees of freedom) lies inside "
            "± the margin stated for the metric before looking, *misses* when it lies wholly outside, and is "
            "*inconclusive* otherwise or with fewer than 3 paired seeds. A row whose two sides run the same network "
            "through the same code path is a *check* (declared, or identical on every seed) and is never counted.",
    "claim": "A claim (an ordering the paper states in words) *reproduces the paper* only when the 95% interval of "
             "the difference of our two means (unpaired, Welch's t) lies wholly on the claimed side, *fails* when it "
             "lies wholly on the other side, and is *inconclusive* otherwise, whatever the operator (<= counts as "
             "<); a non-inferiority claim moves the boundary by the margin its row states. One run per side is "
             "inconclusive.",
}


def to_markdown(results: list[Verdict], files: list[str], retired: list[dict] | None = None) -> list[str]:
    """Markdown lines of the "Reference numbers" section (``files``: the reference files, as shown;
    ``retired``: the files' retired rows, listed with their reasons)."""
    shown = {NOT_RUN} | {k for v in results for k in KIND_VERDICTS[v.kind]} | {v.verdict for v in results}
    counts = ", ".join(f"{sum(v.verdict == k for v in results)} {k}" for k in VERDICTS if k in shown)
    kinds = [k for k in RULES if any(v.kind == k for v in results)]
    lines = ["", "## Reference numbers", "",
             f"From {', '.join(f'`{f}`' for f in files)}; verdicts computed by `laplace_lab.reporting.reference`. "
             + " ".join(RULES[k] for k in kinds)
             + f" *not run*: the table (or CSV) has no such row or metric; the cell says why. Totals: {counts}.", "",
             "| metric | reference | ours | verdict | source |", "|---|---|---|---|---|"]
    for v in results:
        verdict = f"**{v.verdict}**" + (f" ({v.why})" if v.why else "")
        cells = [f"{v.metric} ({v.id})", v.reference, v.ours, verdict, v.source]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    if retired:
        lines += ["", "Retired rows (no longer judged; each with its reason):", ""]
        lines += [f"- `{r['id']}`: {r['what']} Retired because: {r['reason']}" for r in retired]
    return lines
