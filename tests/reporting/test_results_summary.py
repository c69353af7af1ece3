"""laplace_lab.reporting.results_summary: the results/README.md page (counts per paper and table, headline
claims, not-run reasons) from reference files and committed tables; the committed page is current."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from laplace_lab.reporting import preset_table
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
# rows: 4
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
        "headline": [{"claim": "LA is calibrated", "ids": ["ece", "peer_ece"]}],
        "peers": {"peer/a.csv": {"code": "authors", "what": "their repository, end to end"}},
        "margins": [{"metric": "*ece", "margin": 0.5, "reason": "wide"}],
        "retired": [{"id": "gone", "what": "LA NLL < MAP NLL.", "reason": "no sentence of the paper says so"}],
        "references": refs}))
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
    # the peer row: d = 0, 0 on two seeds: identical on every seed, so a check (never counted)
    assert "- LA is calibrated: 1 reproduces the paper, 1 check (rows: `ece`, `peer_ece`)" in text
    assert "| [toy](toy.md) | 1 of 3 | 1 of 1 | 0 of 0 | 0 of 0 | 0 | 1 | 0 | 1 | 0 |" in text
    assert "| peer CSVs | 0 of 0 | 0 of 0 | 0 of 0 | 0 of 0 | 0 | 0 | 0 | 0 | 1 |" in text
    assert "| toy_full (not committed) | 0 of 1 | 0 of 0 | 0 of 0 | 0 of 0 | 0 | 0 | 0 | 1 | 0 |" in text
    assert "Rows that miss (1):\n\n- `conf` (toy): ours 0.7 ± 0.01 (n=3); 50.0 × 0.01 = 0.5; allowed" in text
    assert "Claims that fail" not in text
    assert "- 1 row(s), KMNIST is not available offline: `kmnist` (toy)" in text
    assert "- 1 row(s), results/toy_full.csv is not committed (the table was not run): `ece_full` (toy_full)" in text
    assert "Checks, not counted (1): `peer_ece` (identical on every seed" in text
    assert "- `gone`: LA NLL < MAP NLL. Retired because: no sentence of the paper says so" in text
    # the overview: every paper with its counts over all its tables; a first-format folder is named, not counted
    assert "| [paper](#paper-et-al-2021-venue) | 1 of 4 | 1 of 1 | 0 of 0 | 0 of 0 | 0 | 1 | 0 | 2 | 1 |" in text
    assert "| [old](#old) | first reference format: not counted |" in text
    assert "`reference.yaml` (toy): first reference format" in text and "1 value(s) and 0 claim(s)" in text


def test_table_reports_and_readme_take_their_verdicts_from_the_same_judge(tmp_path, monkeypatch):
    exp, res = setup(tmp_path)
    (res / "toy.md").write_text("# toy\n\nrows\n\n## Reference numbers\n\nold verdicts: reproduces\n\n## Figures\n\nf\n")
    reports = rs.table_reports(exp, res)
    text = reports[res / "toy.md"]
    assert text.startswith("# toy\n\nrows\n\n## Reference numbers\n") and text.endswith("\n## Figures\n\nf\n")
    assert "old verdicts" not in text and "| ood/conf [method_name=la] (conf) |" in text and "**misses**" in text
    (exp / "toy").mkdir()
    (exp / "toy" / "preset.yaml").write_text("# @package _global_\nexperiment_name: toy\naggregate: {name: toy}\n")
    (exp / "toy" / "README.md").write_text("# Toy, Paper et al. 2021\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{preset_table.BEGIN}\n| toy | stale words |\n{preset_table.END}\nend\n")
    out = rs.readme_text(readme, exp, res)
    row = ("| [`toy`](experiments/toy/) | Toy, Paper et al. 2021 | 1 | not run | - | "
           "paper 1 of 3; claims 1 of 1; 1 misses; 1 not run |")
    assert out == "\n".join(["intro", preset_table.BEGIN, preset_table.HEADER, preset_table.RULE, row,
                             preset_table.END, "end"]) + "\n"
    readme.write_text("no markers\n")
    with pytest.raises(preset_table.PresetFolderError, match="lacks the preset table's markers"):
        rs.readme_text(readme, exp, res)


def test_unreadable_results_csv_names_file_line_and_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("")
    with pytest.raises(rs.ResultsCSVError, match=r"t.csv: has no header line"):
        rs.read_results_csv(path)
    header = RESULTS_CSV.splitlines()[1]
    path.write_text(f"{header}\nla,3,seeds,0.02,0.001\n")
    with pytest.raises(rs.ResultsCSVError, match=r"t.csv: line 2: has 5 cells where the header has 11"):
        rs.read_results_csv(path)
    path.write_text(RESULTS_CSV.replace("0.02,0.001,3", "0.02,0.001,three"))
    with pytest.raises(rs.ResultsCSVError, match=r"t.csv: line 3, column 'test/ece n': 'three' is not a number"):
        rs.read_results_csv(path)


def test_check_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results" / "README.md"
    out.parent.mkdir()
    monkeypatch.setattr(rs, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(rs, "outputs", lambda: {out: "page\n"})
    assert rs.main(["--check"]) == 1 and "results/README.md is stale" in capsys.readouterr().err
    assert rs.main([]) == 0 and out.read_text() == "page\n"
    assert rs.main(["--check"]) == 0


def test_every_generated_verdict_page_is_current():
    """results/README.md, every results/<table>.md's verdict section and the top README's verdict
    column: regenerated here, compared byte for byte (one source of verdicts)."""
    stale = [str(p) for p, text in rs.outputs().items() if p.read_text() != text]
    assert not stale, f"{stale} are stale: run `{rs.COMMAND}`"


def test_a_claim_on_a_peer_csv_is_judged_once_not_per_table(tmp_path):
    from laplace_lab.reporting import reference as ref

    exp, res = setup(tmp_path)
    (exp / "paper" / "peer" / "b.csv").write_text(
        "side,seed,model,commit,command,laplace/log_marglik\n"
        + "".join(f"theirs,{s},{m},def,run,{v + s}\n" for s in range(3) for m, v in (("lenet", -80), ("mlp", -95)))
        + "# rows: 6\n")
    path = exp / "paper" / "reference_sel.yaml"
    path.write_text(yaml.safe_dump({
        "format": 2, "preset": "toy", "tables": ["toy", "toy_full"], "paper": "Paper et al. 2021 (Venue)",
        "peers": {"peer/b.csv": {"code": "authors", "what": "their repository, end to end"}},
        "references": [{"id": "sel", "kind": "claim", "claim": "LeNet's evidence > MLP's", "quote": "We select.",
                        "op": ">", "csv": "peer/b.csv", "side": "theirs",
                        "lhs": {"row": {"model": "lenet"}, "metric": "laplace/log_marglik"},
                        "rhs": {"row": {"model": "mlp"}, "metric": "laplace/log_marglik"},
                        "source": {"paper": "P", "where": "Sec. 5", "read_from": "arXiv"}}]}))
    judged = rs.judge_file(ref.load_reference(path), res)
    assert [(j.table, j.verdict.verdict, j.code) for j in judged] == [("", ref.REPRODUCES, "authors")]
    # a claim judged on the peer's side is listed, never counted as a claim reproduced here
    assert "claims reproduced" in rs.HEADER and rs.counts_cells(judged)[1] == "0 of 0"
    data = yaml.safe_load(path.read_text())
    data["references"][0]["side"] = "ours"
    (exp / "paper" / "peer" / "b.csv").write_text((exp / "paper" / "peer" / "b.csv").read_text().replace("theirs,", "ours,"))
    path.write_text(yaml.safe_dump(data))
    judged = rs.judge_file(ref.load_reference(path), res)
    assert [j.verdict.verdict for j in judged] == [ref.REPRODUCES] and rs.counts_cells(judged)[1] == "1 of 1"
