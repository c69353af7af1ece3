"""laplace_lab.reporting.reference, format 2: paper values judged on the paper's error bars, peer rows judged
paired against a CSV of the authors' code, quoted claims judged against the noise; malformed files
and peer CSVs rejected naming the file, the entry and the field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from laplace_lab.reporting import peer_csv, peer_pairs, provenance
from laplace_lab.reporting import reference as ref

GROUP_BY = ["method_name"]
ROWS = [
    {"method_name": "map", "test/ece": (0.010, 0.001, 5), "ood/conf": (0.80, 0.01, 5)},
    {"method_name": "la", "test/ece": (0.020, 0.001, 5), "ood/conf": (0.70, 0.01, 5)},
    {"method_name": "la_star", "test/ece": (0.0215, 0.001, 5), "ood/conf": (0.45, 0.01, 5)},
    {"method_name": "one", "test/ece": (0.5, math.nan, 1)},
]
SOURCE = {"paper": "Paper 2021", "where": "Table 2", "row": "LA", "column": "MMC", "read_from": "arXiv v3, p. 7"}
PEER_CSV = """# command: python peer.py --seeds 0-2
side,seed,method,commit,command,test/la/ece,test/map/ece
ours,0,la,abc123,python -m laplace_lab.train seed=0,0.50,0.1
ours,1,la,abc123,python -m laplace_lab.train seed=1,0.52,0.1
ours,2,la,abc123,python -m laplace_lab.train seed=2,0.54,0.1
theirs,0,la,def456,python uq.py --seed 0,0.49,0.1
theirs,1,la,def456,python uq.py --seed 1,0.515,0.1
theirs,2,la,def456,python uq.py --seed 2,0.525,0.1
ours,0,la_star,abc123,python -m laplace_lab.train seed=0,0.3,
theirs,1,la_star,def456,python uq.py --seed 1,0.3,
"""


def paper(id_, method, metric, printed, **extra):
    return {"id": id_, "kind": "paper", "row": {"method_name": method}, "metric": metric, "printed": printed,
            "source": dict(SOURCE), **extra}


def claim(id_, lhs, op, rhs, metric="test/ece", **extra):
    return {"id": id_, "kind": "claim", "claim": f"{lhs} {op} {rhs}", "quote": "LA is better than MAP.",
            "op": op, "source": {"paper": "Paper 2021", "where": "Sec. 4", "read_from": "arXiv v3, p. 6"},
            "lhs": {"row": {"method_name": lhs}, "metric": metric},
            "rhs": {"row": {"method_name": rhs}, "metric": metric}, **extra}


def peer(id_, method, metric, **extra):
    return {"id": id_, "kind": "peer", "csv": "peer/authors.csv", "row": {"method": method}, "metric": metric,
            "source": "authors' uq.py run here", **extra}


PEERS = {"peer/authors.csv": {"code": "authors", "what": "the authors' uq.py, end to end"}}
MARGINS = [{"metric": "*ece", "margin": 0.02, "reason": "two points of ECE"}]


def write(tmp_path: Path, refs: list, csv_text: str = PEER_CSV, sealed: bool = True, **top) -> Path:
    folder = tmp_path / "paper"
    (folder / "peer").mkdir(parents=True, exist_ok=True)
    (folder / "peer" / "authors.csv").write_text(csv_text)
    if sealed:
        peer_csv.seal(folder / "peer" / "authors.csv")  # its row count last, as the peer scripts write it
    path = folder / "reference.yaml"
    if any(e.get("kind") == "peer" for e in refs if isinstance(e, dict)):
        top = {"peers": PEERS, "margins": MARGINS, **top}
    path.write_text(yaml.safe_dump({"format": 2, "preset": "toy", "paper": "Paper 2021 (Venue)", **top,
                                    "references": refs}, sort_keys=False))
    return path


def judged(tmp_path, refs, rows=ROWS, **top):
    loaded = ref.load_reference(write(tmp_path, refs, **top))
    return {v.id: v for v in ref.verdicts(loaded["references"], rows, GROUP_BY)}


def test_paper_values_judged_on_the_papers_error_bar(tmp_path):
    # ours 0.70 +- 0.01 (n=5); paper std 2.0 points over n=4 runs -> se 0.01; allowed 2*sqrt(2)*0.01 + 0.0005
    out = judged(tmp_path, [
        paper("close", "la", "ood/conf", "69.0±2.0", scale=0.01, error={"kind": "std", "n": 4}),   # |d| 0.010
        paper("far", "la", "ood/conf", "67.0±2.0", scale=0.01, error={"kind": "std", "n": 4}),     # |d| 0.030
        paper("se_kind", "la", "ood/conf", "0.65 ± 0.01", error={"kind": "se"}),                    # 0.05 > 0.0333
        paper("stated_in", "la", "ood/conf", "0.74", tolerance=0.02, tolerance_reason="no error bar printed"),
        paper("stated_out", "la", "ood/conf", "0.75", tolerance=0.02, tolerance_reason="no error bar printed"),
        paper("absent", "mola", "ood/conf", "0.5", tolerance=0.1, tolerance_reason="r",
              not_run_reason="MoLA is not run in this table"),
    ])
    assert out["close"].verdict == ref.REPRODUCES and out["far"].verdict == ref.MISSES
    assert "allowed ±0.02878" in out["close"].reference and "69.0±2.0 (std, n=4) × 0.01 = 0.69" in out["close"].reference
    assert out["se_kind"].verdict == ref.MISSES
    # stated: tolerance 0.02 + 2 se_ours 0.02 + half unit 0.005 = 0.045
    assert out["stated_in"].verdict == ref.REPRODUCES and out["stated_out"].verdict == ref.MISSES
    assert out["absent"].verdict == "not run"
    assert out["absent"].why == "the table has no row {method_name=mola}; MoLA is not run in this table"
    assert out["close"].source == "Paper 2021, Table 2, row LA, column MMC; read from arXiv v3, p. 7"
    assert ref.paper_tolerance(paper("x", "la", "m", "69.0±2.0", scale=0.01, error={"kind": "std", "n": 4}),
                               0.01) == pytest.approx(2 * math.hypot(0.01, 0.01) + 0.0005)


def test_peer_rows_are_an_equivalence_test_with_a_t_interval(tmp_path):
    # la, test/la/ece: d = 0.01, 0.005, 0.015: mean 0.01, se 0.00289, t_2 = 4.303: interval [-0.00242, 0.0224]
    out = judged(tmp_path, [
        peer("inside", "la", "test/la/ece", margin=0.025, margin_reason="wide"),
        peer("straddles", "la", "test/la/ece"),                          # the file's *ece margin 0.02
        peer("outside", "la", "test/la/ece", margin=0.001, margin_reason="tight"),
        peer("same", "la", "test/map/ece"),                              # d = 0 on every seed
        peer("declared", "la", "test/la/ece", check="the same network on both sides"),
        peer("unpaired", "la_star", "test/la/ece", not_run_reason="theirs ran seed 1 only"),
    ])
    assert out["inside"].verdict == ref.MATCHES
    assert out["straddles"].verdict == ref.INCONCLUSIVE
    assert "95% interval [-0.002421, 0.02242] (t_2 = 4.3) vs margin ±0.02" in out["straddles"].ours
    assert out["outside"].verdict == ref.INCONCLUSIVE  # the interval reaches inside ±0.001: not wholly outside
    assert out["same"].verdict == ref.CHECK and "identical on every seed" in out["same"].why
    assert out["declared"].verdict == ref.CHECK and out["declared"].why == "the same network on both sides"
    assert out["inside"].reference == "authors' code: 0.51 (n=3)"
    assert out["unpaired"].verdict == "not run"
    assert out["unpaired"].why.startswith("no paired seed (ours: [0], theirs: [1])")
    assert out["unpaired"].why.endswith("theirs ran seed 1 only")
    mean, se, n, seeds = peer_pairs.paired({"ours": {0: 1.0, 1: 2.0, 5: 9.0}, "theirs": {0: 0.5, 1: 1.0}})
    assert (mean, n, seeds) == (0.75, 2, [0, 1]) and se == pytest.approx(0.25)


def test_peer_code_labels_the_match_and_two_seeds_are_inconclusive(tmp_path):
    two = PEER_CSV.replace("ours,2,la,", "ours,7,la,")  # seed 2 unpaired: 2 pairs left, d = 0.01, 0.005
    peers = {"peer/authors.csv": {"code": "laplace-torch", "what": "laplace-torch on our recipe"}}
    out = judged(tmp_path, [peer("lt", "la", "test/la/ece", margin=0.5, margin_reason="wide")], peers=peers)
    assert out["lt"].verdict == ref.MATCHES_LAPLACE_TORCH and out["lt"].reference.startswith("laplace-torch: ")
    path = write(tmp_path, [peer("two", "la", "test/la/ece", margin=0.5, margin_reason="wide")], csv_text=two)
    verdict = ref.verdicts(ref.load_reference(path)["references"], ROWS, GROUP_BY)[0]
    assert verdict.verdict == ref.INCONCLUSIVE and "2 paired seed(s): an equivalence test needs >= 3" in verdict.ours


def test_a_far_peer_row_misses(tmp_path):
    far = "\n".join(line.replace(",0.5", ",0.9").replace(",0.52,", ",0.92,").replace(",0.54,", ",0.94,")
                    if line.startswith("ours") else line for line in PEER_CSV.splitlines())
    path = write(tmp_path, [peer("far", "la", "test/la/ece")], csv_text=far)
    verdict = ref.verdicts(ref.load_reference(path)["references"], ROWS, GROUP_BY)[0]
    assert verdict.verdict == ref.MISSES  # d = 0.41, 0.405, 0.415: the whole interval beyond 0.02


def test_quoted_claims_reproduce_only_beyond_noise_whatever_the_operator(tmp_path):
    rows = ROWS + [{"method_name": "close", "test/ece": (0.0203, 0.001, 5), "ood/conf": (0.70, 0.01, 5)}]
    out = judged(tmp_path, [
        claim("holds", "la", ">", "map"),             # 0.020 vs 0.010 (se 0.001 each): interval [0.0077, 0.0123]
        claim("fails", "la", "<", "map"),
        claim("noise", "la_star", ">", "la"),         # 0.0215 vs 0.020: interval contains 0
        claim("noise_le", "la_star", ">=", "la"),     # the same with >=: still inconclusive
        claim("wrong_way", "la", ">=", "map", metric="ood/conf"),  # 0.70 vs 0.80: opposite beyond noise
        claim("one_run", "one", ">", "map"),          # n = 1: no noise estimate
        claim("not_worse", "close", "<=", "la", margin=0.005, margin_reason="half a point of ECE"),
        claim("absent", "la", "<", "mola"),
    ], rows=rows)
    assert {k: v.verdict for k, v in out.items()} == {
        "holds": ref.REPRODUCES, "fails": ref.FAILS, "noise": ref.INCONCLUSIVE, "noise_le": ref.INCONCLUSIVE,
        "wrong_way": ref.FAILS, "one_run": ref.INCONCLUSIVE, "not_worse": ref.REPRODUCES, "absent": "not run"}
    assert out["holds"].reference == 'la > map ("LA is better than MAP.")'
    assert "(t = 2.31, Welch)" in out["holds"].why  # equal se and n = 5 each: 8 degrees of freedom
    assert "non-inferiority margin 0.005" in out["not_worse"].why
    assert out["absent"].why == "the table has no row {method_name=mola}"


def test_rules_by_hand():
    from laplace_lab.reporting import verdict_rules as rules
    assert rules.t_quantile(1) == pytest.approx(12.7062, abs=1e-4)
    assert rules.t_quantile(4) == pytest.approx(2.7764, abs=1e-4)
    assert rules.t_quantile(float("inf")) == pytest.approx(1.95996, abs=1e-5)
    assert rules.welch_df(1.0, 5, 1.0, 5) == pytest.approx(8.0)
    assert rules.half_unit("0.894") == 0.0005 and rules.half_unit("1") == 0.0 and rules.half_unit("58.8") == 0.05
    # a printed "1" is a limit, not a rounding: 0.6 does not reproduce it (with a half unit it would)
    assert rules.paper_decision(0.6, 0.0, 1.0, None, 0.0, rules.half_unit("1"))[0] == rules.MISSES
    # non-inferiority: >= with margin 0.1: d = -0.05 +- small reproduces; d = -0.3 fails
    assert rules.claim_decision(">=", (0.95, 0.001, 5), (1.0, 0.001, 5), 0.1)[0] == rules.REPRODUCES
    assert rules.claim_decision(">=", (0.7, 0.001, 5), (1.0, 0.001, 5), 0.1)[0] == rules.FAILS
    with pytest.raises(ValueError, match="needs op <= or >="):
        rules.claim_decision(">", (0.95, 0.001, 5), (1.0, 0.001, 5), 0.1)
    assert rules.peer_decision(0.0, 0.001, 3, 0.01, "m")[0] == "m"
    assert rules.peer_decision(0.0, 0.001, 2, 0.01, "m")[0] == rules.INCONCLUSIVE


def test_markdown_explains_each_kind_present_and_counts(tmp_path):
    loaded = ref.load_reference(write(tmp_path, [paper("p", "la", "ood/conf", "0.74", tolerance=0.02,
                                                       tolerance_reason="r"), peer("q", "la", "test/map/ece")]))
    lines = ref.to_markdown(ref.verdicts(loaded["references"], ROWS, GROUP_BY), ["experiments/paper/reference.yaml"])
    text = "\n".join(lines)
    assert "A paper value *reproduces the paper*" in text and "A peer row pairs" in text and "A claim (" not in text
    assert ("Totals: 1 reproduces the paper, 0 matches the authors' code, 0 matches laplace-torch (same recipe), "
            "0 inconclusive, 0 misses, 0 not run, 1 check.") in text


@pytest.mark.parametrize("entry, message", [
    (claim("c", "la", "<", "map", quote=None), r"entry 'c': field `quote` must be the paper's sentence"),
    ({k: v for k, v in claim("c", "la", "<", "map").items() if k != "quote"}, r"entry 'c': missing field\(s\) \['quote'\]"),
    (claim("c", "la", "<", "la"), r"entry 'c': fields `lhs` and `rhs` are the same row and metric"),
    (claim("c", "la", "<", "map", source="Paper, Sec. 4"), r"entry 'c': field `source` must be a mapping"),
    (paper("p", "la", "m", "0.5", tolerance=0.1, tolerance_reason="r", source={"paper": "P", "where": "Table 1",
                                                                               "read_from": "pdf"}),
     r"entry 'p': field `source` of a table value needs `row`"),
    (paper("p", "la", "m", "0.5", tolerance=0.1, tolerance_reason="r",
           source={**SOURCE, "page": 3}), r"entry 'p': field `source` has unknown key\(s\) \['page'\]"),
    (paper("p", "la", "m", "about 0.5", tolerance=0.1, tolerance_reason="r"), r"entry 'p': field `printed`: 'about 0.5'"),
    (paper("p", "la", "m", "58.8±1.2"), r"entry 'p': field `error` must say what the printed ± is"),
    (paper("p", "la", "m", "58.8±1.2", error={"kind": "std"}), r"entry 'p': field `error`: a std needs `n`"),
    (paper("p", "la", "m", "58.8±1.2", error={"kind": "se"}, tolerance=0.1, tolerance_reason="r"),
     r"entry 'p': field `tolerance`: the printed cell has an error bar"),
    (paper("p", "la", "m", "58.8"), r"entry 'p': field `tolerance`: the printed cell has no error bar"),
    (paper("p", "la", "m", "58.8", tolerance=0.1), r"entry 'p': field `tolerance` needs `tolerance_reason`"),
    (paper("p", "la", "m", "58.8", tolerance=0.1, tolerance_reason="r", scale=0), r"entry 'p': field `scale` must be"),
    ({"id": "v", "kind": "value", "row": {"method_name": "la"}, "metric": "m", "value": 1, "tolerance": 0,
      "source": "s"}, r"entry 'v': field `kind`='value' is not supported in format 2.*write `paper` or `peer`"),
    (peer("q", "la", "test/la/ece", csv="/abs/peer.csv"), r"entry 'q': field `csv` must be a path relative"),
    (peer("q", "la", "test/la/ece", csv="../peer.csv"), r"entry 'q': field `csv` must be a path relative"),
    (peer("q", "la", "test/la/ece", tolerance=0.1, tolerance_reason="r"),
     r"entry 'q': field `tolerance`: a peer row is an equivalence test: give `margin`"),
    (peer("q", "la", "test/la/ece", margin=0.1), r"entry 'q': field `margin` needs `margin_reason`"),
    (peer("q", "la", "test/la/ece", check=""), r"entry 'q': field `check` must say why"),
    (claim("c", "la", "<", "map", margin=0.1, margin_reason="r"), r"entry 'c': field `margin` makes a non-inferiority"),
    (peer("q", "la", "test/nll"), r"entry 'q', field `csv`: .*authors.csv: reference entry 'q': field `metric` "
                                  r"'test/nll' is not a column; allowed: \['test/la/ece', 'test/map/ece'\]"),
    (peer("q", "la", "test/la/ece", row={"data": "mnist"}), r"field `row` key\(s\) \['data'\] are not columns"),
])
def test_format2_entry_validation_names_file_entry_and_field(tmp_path, entry, message):
    path = write(tmp_path, [entry])
    with pytest.raises(ref.ReferenceFileError, match=message) as info:
        ref.load_reference(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("csv_text, message", [
    ("side,seed,commit,test/la/ece\nours,0,abc,0.1\n", r"header: missing column\(s\) \['command'\]"),
    ("side,seed,commit,command,m\nmine,0,abc,run,0.1\n", r"line 2, column `side`: 'mine' is not allowed"),
    ("# made by x\nside,seed,commit,command,m\nours,zero,abc,run,0.1\n", r"line 3, column `seed`: 'zero' is not"),
    ("side,seed,commit,command,m\nours,0,,run,0.1\n", r"line 2, column `commit`: is empty"),
    ("side,seed,commit,command,m\nours,0,abc,run\n", r"line 2: has 4 cells where the header has 5 columns"),
    ("side,seed,commit,command,m\nours,0,abc,run,0.1\nours,0,abc,run,0.2\n", r"side 'ours' has seed 0 twice"),
    ("side,seed,commit,command,m\n", r"body: has no data rows"),
])
def test_malformed_peer_csv_is_rejected_naming_line_and_column(tmp_path, csv_text, message):
    path = write(tmp_path, [{"id": "q", "kind": "peer", "csv": "peer/authors.csv", "row": {}, "metric": "m",
                             "source": "s"}], csv_text=csv_text)
    with pytest.raises(ref.ReferenceFileError, match=message) as info:
        ref.load_reference(path)
    assert "entry 'q', field `csv`" in str(info.value) and "peer/authors.csv" in str(info.value)


Q = {"id": "q", "kind": "peer", "csv": "peer/authors.csv", "row": {}, "metric": "m", "source": "s"}
SEALED = "# made by x\nside,seed,commit,command,m\nours,0,abc,run,0.1\nours,1,abc,run,0.2\ntheirs,0,d,run,0.1\n# rows: 3\n"


@pytest.mark.parametrize("csv_text, message", [
    (SEALED.removesuffix("# rows: 3\n"), r"authors.csv: no '# rows: N' line at its end, so it may be cut off \(a peer "
                                          r"CSV ends with its row count; this one has 3 data rows\)"),
    (SEALED.replace("theirs,0,d,run,0.1\n", ""), r"authors.csv: line 5 says 3 data rows, the file has 2: cut off or "
                                                 r"edited since it was written"),
    (SEALED + "theirs,1,d,run,0.2\n", r"line 6 '# rows: 3' is not the file's last line: rows were added after it"),
    (SEALED.replace("# rows: 3", "# rows: three"), r"line 6 '# rows: three': the row count must be a whole number"),
])
def test_a_peer_csv_cut_off_at_a_line_boundary_is_refused(tmp_path, csv_text, message):
    """A file cut after a whole row is still valid CSV: its last line, the row count, says so."""
    path = write(tmp_path, [Q], csv_text=csv_text, sealed=False)
    with pytest.raises(ref.ReferenceFileError, match=message) as info:
        ref.load_reference(path)
    assert "python -m laplace_lab.reporting.peer_csv --seal" in str(info.value)
    assert len(peer_pairs.read_peer_csv(write(tmp_path, [Q], csv_text=SEALED, sealed=False).parent / Q["csv"]).rows) == 3


def test_the_peer_csv_writers_keep_the_count_last(tmp_path):
    path = tmp_path / "peer.csv"
    fields = ["side", "seed", "commit", "command", "m"]
    for seed in (0, 1):
        peer_csv.append_row(path, {"side": "theirs", "seed": seed, "commit": "d", "command": "run", "m": 0.1}, fields,
                            counted=True)
    assert path.read_bytes().endswith(b"theirs,1,d,run,0.1\r\n# rows: 2\n")
    kept = peer_csv.replace_ours_rows(path, [{"side": "ours", "seed": 0, "commit": "a", "command": "run", "m": 0.2}],
                                      fields)
    table = peer_pairs.read_peer_csv(path)
    assert kept == 2 and len(table.rows) == 3 and table.comments == ()
    before = path.read_bytes()
    assert peer_csv.seal(path) == 3 and path.read_bytes() == before  # sealing again changes no byte


def test_the_committed_peer_csvs_are_sealed():
    files = sorted((provenance.REPO_ROOT / "experiments").glob("*/peer/*.csv"))
    assert files
    for path in files:
        assert peer_pairs.read_peer_csv(path).rows


def test_file_level_fields_of_format2(tmp_path):
    ok = [paper("p", "la", "ood/conf", "0.74", tolerance=0.02, tolerance_reason="r")]
    loaded = ref.load_reference(write(tmp_path, ok, tables=["toy_table"],
                                      headline=[{"claim": "LA is calibrated", "ids": ["p"]}]))
    assert loaded["format"] == 2 and loaded["tables"] == ("toy_table",) and loaded["paper"] == "Paper 2021 (Venue)"
    assert loaded["references"][0]["_format"] == 2
    with pytest.raises(ref.ReferenceFileError, match=r"field `headline` item #0: `ids` \['nope'\] are not entries"):
        ref.load_reference(write(tmp_path, ok, headline=[{"claim": "c", "ids": ["nope"]}]))
    with pytest.raises(ref.ReferenceFileError, match=r"field `format`=3 is not supported; allowed: \[1, 2\]"):
        ref.load_reference(write(tmp_path, ok, format=3))
    with pytest.raises(ref.ReferenceFileError, match="field `paper` must cite the paper"):
        ref.load_reference(write(tmp_path, ok, paper=""))
    with pytest.raises(ref.ReferenceFileError, match=r"unknown top-level key\(s\) \['headlines'\] in format 2"):
        ref.load_reference(write(tmp_path, ok, headlines=[]))


def test_peer_code_margins_and_retired_rows_are_declared_in_the_file(tmp_path):
    q = peer("q", "la", "test/la/ece")
    with pytest.raises(ref.ReferenceFileError, match=r"entry 'q': field `csv` 'peer/authors.csv' is not declared in "
                                                     r"the top-level `peers`"):
        ref.load_reference(write(tmp_path, [q], peers={"peer/other.csv": PEERS["peer/authors.csv"]}))
    with pytest.raises(ref.ReferenceFileError, match=r"`code`='theirs' is not allowed; allowed: \['authors', "
                                                     r"'laplace-torch'\]"):
        ref.load_reference(write(tmp_path, [q], peers={"peer/authors.csv": {"code": "theirs", "what": "x"}}))
    with pytest.raises(ref.ReferenceFileError, match=r"entry 'q': no equivalence margin for metric 'test/la/ece'"):
        ref.load_reference(write(tmp_path, [q], margins=[{"metric": "*nll", "margin": 0.1, "reason": "r"}]))
    with pytest.raises(ref.ReferenceFileError, match=r"`relative` a fraction in \(0, 1\)"):
        ref.load_reference(write(tmp_path, [q], margins=[{"metric": "*", "relative": 2, "reason": "r"}]))
    relative = [{"metric": "*ece", "relative": 0.05, "reason": "5 % of theirs"}]  # 0.05 * 0.51 = 0.0255
    loaded = ref.load_reference(write(tmp_path, [q], margins=relative))
    assert ref.verdicts(loaded["references"], ROWS, GROUP_BY)[0].verdict == ref.MATCHES
    retired = [{"id": "old", "what": "LA NLL < MAP NLL.", "reason": "the paper states no such ordering"}]
    loaded = ref.load_reference(write(tmp_path, [q], retired=retired))
    assert loaded["retired"] == retired
    text = "\n".join(ref.to_markdown(ref.verdicts(loaded["references"], ROWS, GROUP_BY), ["f"], loaded["retired"]))
    assert "- `old`: LA NLL < MAP NLL. Retired because: the paper states no such ordering" in text
    assert ref.load_reference(write(tmp_path, [q], findings=["ECE depends on its bins."]))["findings"] == [
        "ECE depends on its bins."]
    with pytest.raises(ref.ReferenceFileError, match=r"field `findings` must be a list of sentences"):
        ref.load_reference(write(tmp_path, [q], findings="one string"))
    with pytest.raises(ref.ReferenceFileError, match=r"id 'q' is also an entry of `references`"):
        ref.load_reference(write(tmp_path, [q], retired=[dict(retired[0], id="q")]))


def test_printed_cells_parse_with_their_precision():
    assert ref.parse_printed("58.8±1.2") == (58.8, 1.2, pytest.approx(0.05))
    assert ref.parse_printed("0.0123 +- 0.002") == (0.0123, 0.002, pytest.approx(0.00005))
    assert ref.parse_printed("99 %") == (99.0, None, 0.0)  # no decimals: a limit or count, no rounding
    with pytest.raises(ValueError, match="is not a printed number"):
        ref.parse_printed("n/a")


ARCH_CSV = """# a model-selection peer: both sides ran the same candidates
side,seed,commit,command,model,laplace/log_marglik
ours,0,abc,run,lenet,-100
ours,1,abc,run,lenet,-101
ours,2,abc,run,lenet,-102
ours,0,abc,run,mlp_50,-90
ours,1,abc,run,mlp_50,-91
ours,2,abc,run,mlp_50,-92
theirs,0,def,run,lenet,-80
theirs,1,def,run,lenet,-81
theirs,2,def,run,lenet,-82
theirs,0,def,run,mlp_50,-95
theirs,1,def,run,mlp_50,-96
theirs,2,def,run,mlp_50,-94
theirs,0,def,run,mlp_100,-70
"""


def csv_claim(id_, side, lhs="lenet", rhs="mlp_50", **extra):
    entry = claim(id_, lhs, ">", rhs, metric="laplace/log_marglik", csv="peer/authors.csv", side=side)
    return {**entry, "lhs": {"row": {"model": lhs}, "metric": "laplace/log_marglik"},
            "rhs": {"row": {"model": rhs}, "metric": "laplace/log_marglik"}, **extra}


def test_a_claim_on_a_peer_csv_is_judged_on_one_sides_rows_over_seeds(tmp_path):
    out = judged(tmp_path, [csv_claim("ours", "ours"), csv_claim("theirs", "theirs"),
                            csv_claim("one", "theirs", lhs="mlp_100"), csv_claim("none", "ours", lhs="mlp_100")],
                 rows=[], csv_text=ARCH_CSV, peers=PEERS)
    # ours: -101 vs -91 (se 0.577 each): fails; theirs: -81 vs -95: reproduces; one run: inconclusive
    assert {k: v.verdict for k, v in out.items()} == {"ours": ref.FAILS, "theirs": ref.REPRODUCES,
                                                      "one": ref.INCONCLUSIVE, "none": "not run"}
    assert out["ours"].ours == "-101 ± 0.5774 (n=3) vs -91 ± 0.5774 (n=3)"
    assert out["theirs"].ours == "-81 ± 0.5774 (n=3) vs -95 ± 0.5774 (n=3)"
    assert out["theirs"].metric.endswith("on side=theirs of peer/authors.csv")
    assert out["none"].why == "peer/authors.csv has no side=ours row {model=mlp_100} with laplace/log_marglik"
    loaded = ref.load_reference(write(tmp_path, [csv_claim("theirs", "theirs")], csv_text=ARCH_CSV, peers=PEERS))
    assert loaded["references"][0]["_code"] == "authors"


@pytest.mark.parametrize("extra, peers, message", [
    ({"side": None}, PEERS, r"entry 'q': fields `csv` and `side` go together"),
    ({"side": "both"}, PEERS, r"entry 'q': field `side`='both' is not allowed; allowed: \['ours', 'theirs'\]"),
    ({"csv": "../a.csv"}, PEERS, r"entry 'q': field `csv` must be a path relative"),
    ({"lhs": {"row": {"arch": "lenet"}, "metric": "laplace/log_marglik"}}, PEERS,
     r"entry 'q', field `csv`: .*field `lhs`: field `row` key\(s\) \['arch'\] are not columns"),
    ({}, {"peer/other.csv": PEERS["peer/authors.csv"]}, r"entry 'q': field `csv` 'peer/authors.csv' is not declared"),
])
def test_a_claim_on_a_peer_csv_is_validated(tmp_path, extra, peers, message):
    entry = csv_claim("q", "ours")
    entry.update(extra)
    entry = {k: v for k, v in entry.items() if v is not None}
    with pytest.raises(ref.ReferenceFileError, match=message):
        ref.load_reference(write(tmp_path, [entry], csv_text=ARCH_CSV, peers=peers))
