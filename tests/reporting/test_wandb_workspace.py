"""The W&B workspace of a sweep, built offline (``--dry-run``): its run-set filter and grouping,
and the panels that show the logged reliability chart, figures, OOD histograms and tables."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("wandb_workspaces", reason="wandb-workspaces not installed (pip install -e '.[dev]')")

from laplace_lab.reporting.wandb_workspace import build_workspace, main  # noqa: E402


def _panels(spec: dict) -> dict[str, list[dict]]:
    return {s["name"]: s["panels"] for s in spec["sections"]}


def test_dry_run_spec(tmp_path):
    out = tmp_path / "ws.json"
    assert main(["--group", "redux_mnist", "--group-by", "method_name", "seed", "--metrics", "test/la/ece",
                 "--dry-run", str(out)]) == 0
    spec = json.loads(out.read_text())
    assert spec["runset"]["filters"] == "Metric(\"Group\") == 'redux_mnist'"
    assert spec["runset"]["groupby"] == ["Config(name='method_name')", "Config(name='seed')"]
    panels = _panels(spec)
    assert list(panels) == ["Reliability", "OOD", "Metrics"]
    chart, diagrams, table = panels["Reliability"]
    assert chart["type"] == "CustomChart" and chart["chart_name"] == "wandb/line/v0"
    assert chart["query"] == {"summaryTable": {"tableKey": "charts/reliability_table"}}  # what wandb.plot.line logs
    assert chart["chart_fields"] == {"x": "confidence", "y": "accuracy", "stroke": "predictor"}
    assert diagrams["media_keys"] == ["figures/reliability"] and table["table_name"] == "tables/reliability"
    assert [p.get("media_keys", p.get("table_name")) for p in panels["OOD"]] == [["figures/confidence_hist"], "tables/ood"]
    assert [p["type"] for p in panels["Metrics"]] == ["BarPlot", "RunComparer"]
    assert panels["Metrics"][0]["metrics"] == ["test/la/ece"]
    # the payload wandb would store: one run set, filtered on the group, grouped by the config keys
    payload = json.dumps(spec["payload"])
    assert '"filters": [{"key": {"section": "run", "name": "group"}, "op": "=", "value": "redux_mnist"' in payload
    assert '"grouping": [{"section": "config", "name": "method_name.value"}, {"section": "config", "name": "seed.value"}]' in payload


def test_keys_match_what_runs_log():
    """The panel keys are the ones the evaluation (figures/<name>, tables/<name>) and the wandb
    logger (charts/reliability) write: a guard against renaming one side only."""
    import inspect

    from laplace_lab.evaluation import runner
    from laplace_lab.reporting.run_loggers import log_reliability_chart
    from laplace_lab.reporting.wandb_workspace import RELIABILITY_CHART

    assert f'"{RELIABILITY_CHART}"' in inspect.getsource(log_reliability_chart)
    ws = build_workspace("e", "p", "g")
    panels = [p for s in ws.sections for p in s.panels]
    figures = {k.split("/", 1)[1] for p in panels for k in (getattr(p, "media_keys", None) or [])}
    tables = {p.table_name.split("/", 1)[1] for p in panels if hasattr(p, "table_name")}
    source = inspect.getsource(runner)
    assert figures == {"reliability", "confidence_hist"} and tables == {"reliability", "ood"}
    assert all(f'rep.add_figure("{f}"' in source for f in figures)
    assert all(f'rep.add_table("{t}"' in source for t in tables)


def test_group_is_required():
    with pytest.raises(ValueError, match="--group"):
        build_workspace("e", "p", "")
