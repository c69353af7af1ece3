"""laplace_lab.reporting.dashboard without a browser: the page is self-contained, shows each run's
own figures (decodable PNGs), filters by every swept key, and shows the aggregated table's verdicts."""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import re
import shutil
from html.parser import HTMLParser

import pytest
from omegaconf import OmegaConf
from PIL import Image

from laplace_lab.reporting import dashboard, tables
from laplace_lab.reporting import reference as ref
from laplace_lab.sweeps.callback import SweepSummary

from .dashboard_sweep import KINDS, PRESET, SEEDS, draw_figures, make_sweep


class Parsed(HTMLParser):
    """Every tag with its attributes, the runs' cards (with their images) and the selects."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.cards: list[dict] = []
        self.selects: dict[str, list[str]] = {}
        self._select: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section" and a.get("class") == "run":
            self.cards.append({"values": json.loads(a["data-run"]), "images": []})
        elif tag == "img":
            self.cards[-1]["images"].append(a)
        elif tag == "select":
            self._select = a["data-key"]
            self.selects[self._select] = []
        elif tag == "option" and self._select:
            self.selects[self._select].append(a["value"])


@pytest.fixture(scope="module")
def figures() -> dict[str, bytes]:
    return draw_figures()


@pytest.fixture(scope="module")
def built(tmp_path_factory, figures):
    """The sweep as its launch left it (read only: tests that change it take ``sweep``)."""
    return make_sweep(tmp_path_factory.mktemp("dashboard") / "multirun", figures)


@pytest.fixture
def sweep(built, tmp_path):
    """A copy of ``built`` in another folder (its summary.json names the original)."""
    return shutil.copytree(built, tmp_path / "copy")


def test_the_end_of_a_multirun_writes_a_self_contained_page(built, figures):
    sweep = built
    summary = json.loads((sweep / "summary.json").read_text())
    page = sweep / dashboard.PAGE_NAME
    assert summary["dashboard"] == str(page)
    text = page.read_text()
    parsed = Parsed(text)
    links = [(tag, k, v) for tag, a in parsed.tags for k, v in a.items() if k in ("src", "href", "action", "srcset")]
    assert links and all(v.startswith("data:image/png;base64,") for _, _, v in links), links
    assert not [t for t, a in parsed.tags if t in ("link", "iframe", "object", "embed")
                or (t == "script" and "src" in a)]
    assert not re.search(r"https?://|url\(", text.split("<h2>Verdicts")[0] + text.split("<h2>Runs")[1]), \
        "no URL outside the verdicts' cited sources"
    # one card per finished run, each with its own two figures as decodable PNGs, byte for byte
    assert sorted((c["values"]["data.kind"], c["values"]["seed"]) for c in parsed.cards) == \
        sorted((k, str(s)) for k in KINDS for s in SEEDS)
    for card in parsed.cards:
        assert [img["data-figure"] for img in card["images"]] == list(figures)  # those a run wrote
        for img in card["images"]:
            data = base64.b64decode(img["src"].split(",", 1)[1])
            assert data == figures[img["data-figure"]]
            Image.open(io.BytesIO(data)).load()
    # a select per swept key (seed included, the constant trainer.max_epochs not), every value
    assert parsed.selects == {"data.kind": ["", *KINDS], "seed": ["", *map(str, SEEDS)]}
    assert "data.kind=moons,seed=2,trainer.max_epochs=1: failed (RuntimeError: boom)" in text


def test_verdicts_are_the_aggregated_tables(built):
    text = (built / dashboard.PAGE_NAME).read_text()
    entries = [e for f in ref.find_references(PRESET, tables.EXPERIMENTS_DIR) for e in f["references"]]
    assert entries
    section = text.split("<h2>Verdicts</h2>")[1].split("<h2>")[0]
    assert "The verdicts of toy2d.md. From experiments/" in section
    cells = re.findall(r'<td class="verdict">([^<]*)</td>', section)
    assert len(cells) == len(entries)
    assert all(c.split(" (")[0] in ref.VERDICTS for c in cells)
    for e in entries:
        assert f"({e['id']})" in section


def test_a_sweep_that_was_not_aggregated_says_so(tmp_path, figures):
    sweep = make_sweep(tmp_path / "multirun", figures, aggregate=False)
    text = (sweep / dashboard.PAGE_NAME).read_text()
    assert "no verdicts: not aggregated" in text
    head = re.search(r"<tr><th>data.kind</th><th>seed</th>(.*?)</tr>", text).group(1)
    logged = sorted(json.loads(next(sweep.glob("*/metrics.json")).read_text()))
    expected = [m for pattern in dashboard.HEADLINE for m in logged if fnmatch.fnmatchcase(m, pattern)]
    assert re.findall(r"<th>([^<]*)</th>", head) == expected and "val/nll" in logged and "val/nll" not in expected


def test_missing_and_broken_figures_are_named_not_hidden(sweep):
    jobs = sorted(p.parent for p in sweep.glob("*/metrics.json"))
    (jobs[0] / "figures" / "reliability.png").unlink()
    (jobs[0] / "eval_report.json").write_text(json.dumps({"skipped": {"ood": "evaluation.ood.enabled=false"}}))
    (jobs[1] / "figures" / "confidence_hist.png").write_bytes(b"not a png")
    text = dashboard.build(sweep).read_text()
    assert "not drawn: no figures/reliability.png (evaluation skipped ood: evaluation.ood.enabled=false)" in text
    assert "figures/confidence_hist.png is not a PNG file (9 bytes)" in text
    assert sum(len(c["images"]) for c in Parsed(text).cards) == 4 * 2 - 2


def test_the_cli_rebuilds_a_moved_sweep(sweep, capsys):
    moved = sweep
    (moved / dashboard.PAGE_NAME).unlink()
    dashboard.main([str(moved), "--figures", "reliability"])
    page = moved / dashboard.PAGE_NAME
    assert capsys.readouterr().out.strip() == str(page)
    parsed = Parsed(page.read_text())
    assert [len(c["images"]) for c in parsed.cards] == [1] * 4
    assert "The verdicts of toy2d.md. From experiments/" in page.read_text()  # the table found in the moved folder


@pytest.mark.parametrize("argv, message", [
    (["{missing}"], "does not exist"),
    (["{empty}"], "has no summary.json"),
    (["{empty}", "--figures", "../x"], "is not a plain name"),
])
def test_cli_errors_name_the_problem(tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    argv = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in argv]
    with pytest.raises(SystemExit) as exc:
        dashboard.main(argv)
    assert message in str(exc.value) and str(exc.value).startswith(dashboard.COMMAND)


def test_a_failed_dashboard_fails_the_multirun_and_says_how_to_rebuild(sweep, caplog):
    class Broken:
        def dashboard(self, sweep_dir):
            raise OSError("disk full")

    shutil.rmtree(next(p.parent for p in sweep.glob("*/status.json") if "failed" in p.read_text()))
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    with pytest.raises(SystemExit):
        SweepSummary(aggregator=Broken()).on_multirun_end(cfg)
    assert f"rebuild it with python -m laplace_lab.reporting.dashboard {sweep}" in caplog.text
    assert "OSError: disk full" in caplog.text


def test_the_reference_section_is_read_as_written(tmp_path):
    md = tmp_path / "t.md"
    md.write_text("# t\n\n## Reference numbers\n\nNo `experiments/*/reference*.yaml` names preset `toy`: no verdicts.\n")
    assert dashboard.verdicts(md) == (None, "No experiments/*/reference*.yaml names preset toy: no verdicts.")
    md.write_text("# t\n\n## Reference numbers\n\nA *claim* holds.\n\n| metric | reference | ours | verdict | source |\n"
                  "|---|---|---|---|---|\n| a \\| b (x) | 1 | 2 | **fails** (d = 1) | p |\n\n## Figures\n\nno\n")
    rows, note = dashboard.verdicts(md)
    assert note == "The verdicts of t.md. A claim holds."
    assert rows == [{"metric": "a | b (x)", "reference": "1", "ours": "2", "verdict": "fails (d = 1)", "source": "p"}]
    md.write_text("# t\n")
    assert dashboard.verdicts(md)[0] is None and "no reference section" in dashboard.verdicts(md)[1]
    assert dashboard.verdicts(None) == (None, "no verdicts: not aggregated")
