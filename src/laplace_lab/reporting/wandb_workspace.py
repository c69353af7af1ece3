"""A W&B workspace for one sweep: ``python -m laplace_lab.reporting.wandb_workspace --group <experiment_name>``.

Every job of a sweep is a wandb run in the group ``logger.wandb.group`` (the ``experiment_name``).
After ``wandb sync`` of the offline runs, this builds a saved workspace view of the project that
shows only that group's runs, grouped by config keys (default ``method_name``), with three
sections, through the ``wandb_workspaces`` package (``pip install wandb-workspaces``):

- Reliability: the ``charts/reliability`` line plot (accuracy against confidence per predictor;
  runs overlaid), the ``figures/reliability`` diagrams side by side, the ``tables/reliability`` table;
- OOD: the ``figures/confidence_hist`` histograms (in- vs out-of-distribution confidence) and the
  ``tables/ood`` table;
- Metrics: a bar plot per test metric (mean over the runs of a group) and a run comparer.

``--dry-run PATH`` writes the workspace as JSON (a readable summary and the exact payload wandb
would store) without any network access; otherwise ``Workspace.save()`` creates the view and
its URL is printed (needs ``wandb login``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
DEFAULT_METRICS = ("test/map/acc", "test/la/acc", "test/map/nll", "test/la/nll", "test/map/ece", "test/la/ece")
RELIABILITY_CHART = "charts/reliability"  # logged by run_loggers.log_reliability_chart (wandb.plot.line)


def _modules():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as err:
        raise ImportError("the W&B workspace needs the wandb_workspaces package: "
                          "pip install wandb-workspaces (or pip install -e '.[dev]')") from err
    return ws, wr


def build_workspace(entity: str, project: str, group: str, group_by: list[str] | tuple[str, ...] = ("method_name",),
                    metrics: list[str] | tuple[str, ...] = DEFAULT_METRICS, name: str | None = None):
    """The ``wandb_workspaces.workspaces.Workspace`` of the sweep ``group`` (no network)."""
    if not group:
        raise ValueError("--group is required: the sweep's experiment_name (logger.wandb.group)")
    ws, wr = _modules()
    wide = wr.Layout(x=0, y=0, w=12, h=8)
    reliability = ws.Section(name="Reliability", is_open=True, panels=[
        wr.CustomChart(query={"summaryTable": {"tableKey": f"{RELIABILITY_CHART}_table"}}, chart_name="wandb/line/v0",
                       chart_fields={"x": "confidence", "y": "accuracy", "stroke": "predictor"},
                       chart_strings={"title": "Reliability (accuracy vs confidence)"}, layout=wide),
        wr.MediaBrowser(title="Reliability diagrams", media_keys=["figures/reliability"], mode="grid",
                        grid_x_axis="run", layout=wide),
        wr.WeavePanelSummaryTable(table_name="tables/reliability", layout=wide),
    ])
    ood = ws.Section(name="OOD", is_open=True, panels=[
        wr.MediaBrowser(title="Confidence histograms (in- vs out-of-distribution)", media_keys=["figures/confidence_hist"],
                        mode="grid", grid_x_axis="run", layout=wide),
        wr.WeavePanelSummaryTable(table_name="tables/ood", layout=wide),
    ])
    table = ws.Section(name="Metrics", is_open=True, panels=[
        *(wr.BarPlot(title=m, metrics=[wr.SummaryMetric(m)], groupby_aggfunc="mean", groupby_rangefunc="stderr")
          for m in metrics),
        wr.RunComparer(diff_only="split", layout=wide),
    ])
    runset = ws.RunsetSettings(filters=[ws.Metric("Group") == group], groupby=[ws.Config(k) for k in group_by])
    return ws.Workspace(entity=entity, project=project, name=name or f"sweep {group}",
                        sections=[reliability, ood, table], runset_settings=runset)


def _panel_summary(panel: Any) -> dict:
    keys = ("title", "media_keys", "table_name", "chart_name", "chart_fields", "query", "diff_only")
    out = {"type": type(panel).__name__}
    for key in keys:
        value = getattr(panel, key, None)
        if value not in (None, [], {}):
            out[key] = value
    if getattr(panel, "metrics", None):
        out["metrics"] = [getattr(m, "name", m) for m in panel.metrics]
    return out


def describe(workspace) -> dict:
    """A readable JSON summary of the workspace (sections, panels, run-set filter and grouping)
    plus ``payload``: what ``Workspace.save()`` would send (built offline)."""
    rs = workspace.runset_settings
    return {
        "entity": workspace.entity, "project": workspace.project, "name": workspace.name,
        "runset": {"filters": rs.filters if isinstance(rs.filters, str) else [str(f) for f in rs.filters],
                   "groupby": [str(g) for g in rs.groupby]},
        "sections": [{"name": s.name, "panels": [_panel_summary(p) for p in s.panels]} for s in workspace.sections],
        "payload": workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m laplace_lab.reporting.wandb_workspace", description=__doc__.split("\n\n")[0])
    p.add_argument("--group", required=True, help="the sweep's experiment_name (its runs' wandb group)")
    p.add_argument("--entity", default=None, help="wandb entity (default: your wandb default entity)")
    p.add_argument("--project", default="laplace-lab", help="wandb project (logger.wandb.project)")
    p.add_argument("--group-by", nargs="*", default=["method_name"], help="config keys that group the runs")
    p.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS), help="summary metrics to plot as bars")
    p.add_argument("--name", default=None, help="name of the saved view (default: 'sweep <group>')")
    p.add_argument("--dry-run", type=Path, default=None, metavar="PATH",
                   help="write the workspace as JSON to PATH instead of saving it (no network)")
    args = p.parse_args(argv)
    entity = args.entity
    if entity is None and args.dry_run is None:
        import wandb

        entity = wandb.Api().default_entity
    workspace = build_workspace(entity or "<entity>", args.project, args.group, args.group_by, args.metrics, args.name)
    if args.dry_run is not None:
        args.dry_run.parent.mkdir(parents=True, exist_ok=True)  # e.g. outputs/, which the repository ignores
        args.dry_run.write_text(json.dumps(describe(workspace), indent=1))
        print(f"Workspace spec written to {args.dry_run}")
        return 0
    workspace.save()
    print(f"Workspace saved: {workspace.url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
