"""laplace_lab.reporting.results_summary: the results/README.md page (counts per paper and table, headline
claims, not-run reasons) from reference files and committed tables; the committed page is current."""

from __future__ import annotations

from pathlib import Path

import yaml

from laplace_lab.reporting import results_summary as rs

RESULTS_CSV = """# table: toy
method_name,n,seeds,test/ece mean,test/ece se,test/ece n,test/ece nonfinite,ood/conf mean,ood/conf se,ood/conf n,ood/conf nonfinite
la,3,"seed=0, seed=1, seed=2",0.02,0.001,3,0,0.70,0.01,3,0
map,3,"seed=0, seed=1, seed=2",0.01,0.001,3,0,0.80,0.01,3,0
"""
PEER_CSV = """side,seed,method,commit,command,test/la/ece
ours,0,la,abc,run,0.5
ours,1,la,abc,run,0.6
theirs,0,la,def,run,0.5
theirs,1,la,def,run,0.6
"""
SOURCE = {"paper": "P", "where": "Table 1", "row": "LA", "column": "ECE", "read_from": "arXiv"}


def setup(tmp_path: Path) -> tuple[Path, Path]:
    exp, res = tmp_path / "experiments", tmp_path / "results"
    (exp / "paper" / "peer").mkdir(parents=True)
    res.mkdir()
    (res / "toy.csv").write_text(RESULTS_CSV)
    (res / "toy.md").write_text("# toy\n")
    (exp / "paper" / "peer" / "a.csv").write_text(PEER_CSV)
    refs = [
        {"id": "ece", "kind": "paper", "row": {"method_name": "la"}, "metric": "test/ece", "printed": "2.0±0.1",
         "scale": 0.01, "error": {"kind": "std", "n": 5}, "source": SOURCE},
        {"id": "conf", "kind": "paper", "row": {"method_name": "la"}, "metric": "ood/conf", "printed": "50.0",
         "scale": 0.01, "tolerance": 0.01, "tolerance_reason": "none printed", "source": SOURCE},
        {"id": "kmnist", "kind": "paper", "row": {"method_name": "la"}, "metric": "ood/kmnist/conf",
         "printed": "60.0", "scale": 0.01, "tolerance": 0.01, "tolerance_reason": "none printed", "source": SOURCE,
         "not_run_reason": "KMNIST is not available offline"},
        {"id": "peer_ece", "kind": "peer", "csv": "peer/a.csv", "row": {"method": "la"}, "metric": "test/la/ece",
         "source": "uq.py"},
        {"id": "calibrated", "kind": "claim", "claim": "LA ECE > MAP ECE", "quote": "LA is worse.", "op": ">",
         "lhs": {"row": {"method_name": "la"}, "metric": "test/ece"},
         "rhs": {"row": {"method_name": "map"}, "metric": "test/ece"},
         "source": {"paper": "P", "where": "Sec. 4", "read_from": "arXiv"}},
    ]
    (exp / "paper" / "reference.yaml").write_text(yaml.safe_dump({
        "format": 2, "preset": "toy", "paper": "Paper et al. 2021 (Venue)",
        "headline": [{"claim": "LA is calibrated", "ids": ["ece", "peer_ece"]}], "references": refs}))
    (exp / "paper" / "reference_full.yaml").write_text(yaml.safe_dump({
        "format": 2, "preset": "toy", "tables": ["toy_full"], "paper": "Paper et al. 2021 (Venue)",
        "references": [dict(refs[0], id="ece_full")]}))
    (exp / "old").mkdir()
    (exp / "old" / "reference.yaml").write_text(yaml.safe_dump({"preset": "toy", "references": [
        {"id": "v", "kind": "value", "row": {"method_name": "la"}, "metric": "test/ece", "value": 0.02,
         "tolerance": 0.01, "source": "somewhere"}]}))
    return exp, res


def test_render_counts_rows_per_table_with_headlines_and_reasons(tmp_path):
    exp, res = setup(tmp_path)
    text = rs.render(exp, res)
    assert "## Paper et al. 2021 (Venue)" in text
    assert "- LA is calibrated: 1 reproduces, 1 matches the authors' code (rows: `ece`, `peer_ece`)" in text
    assert "| [toy](toy.md) | 1 of 3 | 0 of 0 | 1 | 1 | 1 / 0 / 0 / 0 |" in text
    assert "| peer CSVs (authors' code) | 0 of 0 | 1 of 1 | 0 | 0 | 0 / 0 / 0 / 0 |" in text
    assert "| toy_full (not committed) | 0 of 1 | 0 of 0 | 0 | 1 | 0 / 0 / 0 / 0 |" in text
    assert "Quantitative rows that miss: `conf` (toy)." in text and "Quoted orderings that fail" not in text
    assert "- 1 row(s), KMNIST is not available offline: `kmnist` (toy)" in text
    assert "- 1 row(s), results/toy_full.csv is not committed (the table was not run): `ece_full` (toy_full)" in text
    # the overview: every paper with its counts over all its tables; a first-format folder is named, not counted
    assert "| [paper](#paper-et-al-2021-venue) | 1 of 4 | 1 of 1 | 1 | 2 | 1 / 0 / 0 / 0 |" in text
    assert "| [old](#old) | first reference format: not counted | | | | |" in text
    assert "`reference.yaml` (toy): first reference format" in text and "1 value(s) and 0 claim(s)" in text


def test_check_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    _, res = setup(tmp_path)
    text = "page\n"
    monkeypatch.setattr(rs, "render", lambda: text)
    out = res / "README.md"
    assert rs.main(["--check", "--output", str(out)]) == 1 and "is stale" in capsys.readouterr().err
    assert rs.main(["--output", str(out)]) == 0 and out.read_text() == text
    assert rs.main(["--check", "--output", str(out)]) == 0


def test_committed_results_readme_is_current():
    committed = rs.RESULTS_DIR / "README.md"
    assert committed.read_text() == rs.render(), f"{committed} is stale: run `{rs.COMMAND}`"
