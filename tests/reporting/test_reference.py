"""laplace_lab.reporting.reference: validation of reference.yaml files and the verdict of each kind."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from laplace_lab.reporting import reference as ref

GROUP_BY = ["method_name"]
# results rows as tables.group_rows makes them: metric -> (mean, se, n)
ROWS = [
    {"method_name": "map", "test/ece": (0.010, 0.001, 5), "ood/conf": (0.80, 0.01, 5)},
    {"method_name": "la", "test/ece": (0.020, 0.001, 5), "ood/conf": (0.70, 0.01, 5)},
    {"method_name": "la_star", "test/ece": (0.150, 0.010, 5), "ood/conf": (0.45, 0.01, 5)},
    {"method_name": "1.0", "test/ece": (0.5, math.nan, 1)},
]


def value(id_, method, metric, v, tol, **extra):
    return {"id": id_, "kind": "value", "row": {"method_name": method}, "metric": metric, "value": v,
            "tolerance": tol, "source": "Paper, Table 1", **extra}


def claim(id_, lhs, op, rhs, metric="test/ece"):
    return {"id": id_, "kind": "claim", "claim": f"{lhs} {op} {rhs}", "op": op, "source": "Paper, Sec. 4",
            "lhs": {"row": {"method_name": lhs}, "metric": metric},
            "rhs": {"row": {"method_name": rhs}, "metric": metric}}


def write(tmp_path: Path, refs: list, preset: str = "toy", folder: str = "paper") -> Path:
    path = tmp_path / folder / "reference.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"preset": preset, "references": refs}, sort_keys=False))
    return path


def by_id(results):
    return {v.id: v for v in results}


def test_value_verdicts_use_tolerance_plus_standard_error():
    out = by_id(ref.verdicts([
        value("exact", "map", "test/ece", 0.010, 0.0),
        value("within_se", "map", "test/ece", 0.0105, 0.0),       # |diff| 0.0005 <= 0 + se 0.001
        value("within_tol", "la", "test/ece", 0.0245, 0.004),     # 0.0045 <= 0.004 + 0.001
        value("miss", "la", "test/ece", 0.030, 0.004),            # 0.010 > 0.005
        value("n1_no_se", "1", "test/ece", 0.51, 0.005),          # se NaN counts as 0; "1" matches "1.0"
    ], ROWS, GROUP_BY))
    assert [out[k].verdict for k in ("exact", "within_se", "within_tol", "miss", "n1_no_se")] == [
        "reproduces", "reproduces", "reproduces", "does not reproduce", "does not reproduce"]
    assert out["within_tol"].ours == "0.02 ± 0.001 (n=5)" and out["n1_no_se"].ours == "0.5 (n=1)"
    assert out["miss"].reference == "0.03 ± 0.004" and out["miss"].metric == "test/ece [method_name=la]"


def test_order_group_same_ordering_only_when_the_ranking_holds():
    # paper OOD confidence 0.64 / 0.59 / 0.47: ours 0.80 / 0.70 / 0.45 miss but keep the order
    good = [value(f"conf_{m}", m, "ood/conf", v, 0.03, order_group="conf")
            for m, v in (("map", 0.642), ("la", 0.588), ("la_star", 0.47))]
    out = by_id(ref.verdicts(good, ROWS, GROUP_BY))
    assert out["conf_map"].verdict == "same ordering" and out["conf_la"].verdict == "same ordering"
    assert out["conf_la_star"].verdict == "reproduces"  # |0.45 - 0.47| <= 0.03 + se 0.01
    swapped = [value("a", "map", "ood/conf", 0.5, 0.01, order_group="g"), value("b", "la", "ood/conf", 0.6, 0.01,
                                                                                order_group="g")]
    assert {v.verdict for v in ref.verdicts(swapped, ROWS, GROUP_BY)} == {"does not reproduce"}
    missing = [value("a", "map", "ood/conf", 0.9, 0.01, order_group="g"),
               value("b", "nope", "ood/conf", 0.1, 0.01, order_group="g")]
    assert [v.verdict for v in ref.verdicts(missing, ROWS, GROUP_BY)] == ["does not reproduce", "not run"]


def test_claims_and_not_run():
    out = by_id(ref.verdicts([
        claim("la_better", "la", "<", "map"),       # 0.020 < 0.010: false
        claim("map_better", "map", "<=", "la"),
        claim("star_worse", "la_star", ">", "la"),
        claim("absent_row", "mola", "<", "map"),
        claim("absent_metric", "la", ">=", "map", metric="test/nope"),
    ], ROWS, GROUP_BY))
    assert out["la_better"].verdict == "does not reproduce"
    assert out["map_better"].verdict == out["star_worse"].verdict == "reproduces"
    assert out["absent_row"].verdict == out["absent_metric"].verdict == "not run"
    assert out["la_better"].ours == "0.02 ± 0.001 (n=5) vs 0.01 ± 0.001 (n=5)"
    assert out["la_better"].reference == "la < map"
    not_run = ref.verdicts([value("v", "mola", "test/ece", 0.1, 0.1)], ROWS, GROUP_BY)
    assert not_run[0].verdict == "not run" and not_run[0].ours == "-"


def test_row_must_pick_one_row_by_group_by_keys():
    rows = [{"data.name": "mnist", "method_name": "la", "m": (1.0, 0.0, 2)},
            {"data.name": "fmnist", "method_name": "la", "m": (2.0, 0.0, 2)}]
    with pytest.raises(ref.ReferenceFileError, match="matches 2 rows"):
        ref.verdicts([value("x", "la", "m", 1.0, 0.1)], rows, ["data.name", "method_name"])
    bad = value("y", "la", "m", 1.0, 0.1)
    bad["row"] = {"model": "lenet"}
    with pytest.raises(ref.ReferenceFileError, match=r"entry 'y'.*\['model'\] are not group-by keys"):
        ref.verdicts([bad], rows, ["data.name", "method_name"])
    two = value("z", "la", "m", 2.0, 0.0)
    two["row"] = {"method_name": "la", "data.name": "fmnist"}
    assert ref.verdicts([two], rows, ["data.name", "method_name"])[0].verdict == "reproduces"


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.pop("tolerance"), r"entry 'v': missing field\(s\) \['tolerance'\]"),
    (lambda e: e.update(tolerance=-1), r"entry 'v': field `tolerance` must be a finite number >= 0"),
    (lambda e: e.update(value=float("nan")), r"entry 'v': field `value` must be a finite number"),
    (lambda e: e.update(value="0.1"), r"entry 'v': field `value` must be a finite number"),
    (lambda e: e.update(kind="number"), r"entry 'v': field `kind`='number' is not supported in format 1; allowed"),
    (lambda e: e.update(tolerence=1), r"entry 'v': unknown field\(s\) \['tolerence'\]"),
    (lambda e: e.update(row="la"), r"entry 'v': `row` must be a non-empty mapping"),
    (lambda e: e.update(source=""), r"entry 'v': field `source` must name"),
    (lambda e: e.update(id=None), r"entry #0: field `id` must be a non-empty string"),
])
def test_value_entry_validation_names_file_entry_and_field(tmp_path, edit, message):
    entry = value("v", "la", "test/ece", 0.1, 0.01)
    edit(entry)
    path = write(tmp_path, [entry])
    with pytest.raises(ref.ReferenceFileError, match=message) as info:
        ref.load_reference(path)
    assert str(path) in str(info.value)


def test_claim_and_file_validation(tmp_path):
    c = claim("c", "la", "<", "map")
    c["op"] = "<<"
    with pytest.raises(ref.ReferenceFileError, match=r"entry 'c': field `op`='<<' is not supported; allowed"):
        ref.load_reference(write(tmp_path, [c]))
    c = claim("c", "la", "<", "map")
    c["lhs"] = {"row": {"method_name": "la"}}
    with pytest.raises(ref.ReferenceFileError, match=r"entry 'c': field `lhs` must be a mapping with exactly"):
        ref.load_reference(write(tmp_path, [c]))
    with pytest.raises(ref.ReferenceFileError, match="field `id` is used twice"):
        ref.load_reference(write(tmp_path, [value("a", "la", "m", 1, 0), value("a", "map", "m", 1, 0)]))
    path = write(tmp_path, [value("a", "la", "m", 1, 0)])
    path.write_text("preset: toy\nreferences: []\n")
    with pytest.raises(ref.ReferenceFileError, match="`references` must be a non-empty list"):
        ref.load_reference(path)
    path.write_text("preset: toy\nrefs: []\n")
    with pytest.raises(ref.ReferenceFileError, match=r"unknown top-level key\(s\) \['refs'\]"):
        ref.load_reference(path)


def test_find_references_by_preset_and_markdown(tmp_path):
    write(tmp_path, [value("a", "la", "test/ece", 0.02, 0.0, note="paper's Table 2")], preset="toy", folder="p1")
    write(tmp_path, [claim("b", "la", "<", "map")], preset="other", folder="p2")
    found = ref.find_references("toy", tmp_path)
    assert [f["path"].parent.name for f in found] == ["p1"]
    lines = ref.to_markdown(ref.verdicts(found[0]["references"], ROWS, GROUP_BY), ["experiments/p1/reference.yaml"])
    assert "## Reference numbers" in lines and "| metric | reference | ours | verdict | source |" in lines
    assert "| test/ece [method_name=la] (a) | 0.02 ± 0 | 0.02 ± 0.001 (n=5) | **reproduces** | Paper, Table 1 |" in lines
    assert any("Totals: 0 not run, 1 reproduces, 0 same ordering, 0 does not reproduce." in line for line in lines)


def test_one_file_may_name_a_preset_and_its_cpu_sibling(tmp_path):
    from laplace_lab.reporting.reference import find_references, load_reference

    folder = tmp_path / "paper"
    folder.mkdir()
    (folder / "reference.yaml").write_text(
        "preset: [paper, paper_cpu]\nreferences:\n"
        "  - {id: a, kind: value, row: {m: x}, metric: acc, value: 1.0, tolerance: 0.1, source: s}\n")
    assert load_reference(folder / "reference.yaml")["presets"] == ("paper", "paper_cpu")
    assert [len(find_references(p, tmp_path)) for p in ("paper", "paper_cpu", "other")] == [1, 1, 0]
