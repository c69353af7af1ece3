"""An offline wandb run of a multirun job: grouped, flattened config, reliability table and chart."""

from __future__ import annotations

import json

from tests.sweeps.helpers import multirun, summary, wandb_records


def _history(records) -> dict:
    """Logged values by key; a media value (``nested_key = [key, field]``) becomes a dict of fields."""
    logged: dict = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        for item in record.history.item:
            keys = [item.key] if item.key else list(item.nested_key)
            if len(keys) == 1:
                logged[keys[0]] = json.loads(item.value_json)
            else:
                logged.setdefault(keys[0], {})[keys[1]] = json.loads(item.value_json)
    return logged


def test_offline_wandb_run_is_grouped_with_config_and_reliability_table(tmp_path):
    proc, sweep = multirun(tmp_path, "experiment_name=wbexp", "data=toy2d", "trainer=debug", "logger=default",
                           "logger.wandb.enabled=true", "logger.wandb.mode=offline", "logger.wandb.tags=[sweep,ci]", "evaluation.ood.enabled=false",
                           "evaluation.toy2d.enabled=false", "seed=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = summary(sweep)["finished"]
    (run_dir,) = (sweep / job / "wandb").glob("offline-run-*")
    records = wandb_records(next(run_dir.glob("run-*.wandb")))

    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_group == "wbexp" and run.job_type == "train" and list(run.tags) == ["sweep", "ci"]
    assert run.display_name == job
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["experiment_name"] == "wbexp" and config["optimizer.lr"] == 1e-2 and config["seed"] == 0
    assert not any(isinstance(v, dict) for k, v in config.items() if k != "_wandb")  # flattened

    logged = _history(records)
    table = logged["tables/reliability"]
    assert table["_type"] == "table-file"
    content = json.loads((run_dir / "files" / table["path"]).read_text())
    assert {"predictor", "confidence", "accuracy", "count"} <= set(content["columns"]) and content["data"]
    chart_table = logged["charts/reliability_table"]
    assert (run_dir / "files" / chart_table["path"]).is_file()
    panels = [u.value_json for r in records if r.WhichOneof("record_type") == "config" for u in r.config.update]
    assert any("wandb/line" in p and "charts/reliability_table" in p for p in panels)
