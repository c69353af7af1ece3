"""The committed tables' provenance: each results/<name>.md says one clean commit, its .jobs.csv agrees
job by job, and that commit contains the preset its jobs were launched with."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from laplace_lab.reporting.provenance import preset_files

ROOT = Path(__file__).resolve().parents[1]
TABLES = sorted(p for p in (ROOT / "results").glob("*.md") if p.with_suffix(".jobs.csv").exists())


def header(table: Path) -> tuple[str, set[str]]:
    """The commit of the table's ``- commit: <sha> (dirty: False)`` line and the presets its launch commands
    name: the header's ``- command (...)`` lines, and the jobs CSV's ``command`` column where it has one (a table
    of more than four launches lists them there only)."""
    text = table.read_text()
    m = re.search(r"^- commit: ([0-9a-f]{40}) \(dirty: False\)$", text, re.M)
    assert m, f"{table.name}: no '- commit: <sha> (dirty: False)' line (one clean commit)"
    commands = re.findall(r"^- command \([^)]*\): (.*)$", text, re.M)
    jobs = pd.read_csv(table.with_suffix(".jobs.csv"), comment="#")
    if "command" in jobs:
        commands += [c for c in jobs["command"] if isinstance(c, str)]
    presets = {p for c in commands for p in re.findall(r"experiment=([\w-]+)", c)}
    return m.group(1), presets


def test_some_tables_are_committed():
    assert len(TABLES) >= 10, [t.name for t in TABLES]


def test_no_committed_table_write_was_cut_off():
    """A journal of ``io.atomic.write_texts_together`` in results/: a table write stopped between its
    renames (``table_commit.settled_table`` completes it; commit the completed files, not the journal)."""
    assert not sorted((ROOT / "results").glob(".*.writing.json"))


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.stem)
def test_table_jobs_come_from_its_one_clean_commit(table):
    commit, presets = header(table)
    jobs = pd.read_csv(table.with_suffix(".jobs.csv"), comment="#")
    assert len(jobs) > 0, table.name
    assert set(jobs["commit"]) == {commit}, f"{table.name}: jobs' commits {set(jobs['commit'])} != header {commit}"
    assert not jobs["dirty"].astype(str).str.lower().eq("true").any(), f"{table.name}: a job ran on a dirty tree"
    assert len(presets) == 1, f"{table.name}: launch commands name presets {presets}"


@pytest.mark.parametrize("table", TABLES, ids=lambda p: p.stem)
def test_table_commit_contains_its_preset(table):
    commit, presets = header(table)
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout")
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {commit[:12]} is not in this clone's history (shallow clone)")
    for preset in presets:
        found = [subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{path}"],
                                capture_output=True).returncode == 0 for path in preset_files(preset)]
        assert any(found), f"{table.name}: commit {commit[:12]} has none of {preset_files(preset)}"


RECORDS = sorted((ROOT / "results" / "sweeps").glob("**/status.json"))


# What presets changed since the committed records ran: a relaunch runs these jobs again.
CHANGED_SINCE = {"immer2021_images": {"map_grid", "map_grid_refit"}}  # half-decade grid, refit on all images


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


@pytest.mark.parametrize("status_path", [p for p in RECORDS if "seed=0" in p.parent.name],
                         ids=lambda p: p.parent.name)
def test_a_relaunch_of_a_committed_sweep_skips_its_finished_jobs(status_path):
    """Each committed job record's overrides compose to the config hash it recorded (``config_hash`` in
    ``status.json``; ``sweeps.status.unchanged_config``: options added since at their default do not
    count), so relaunching its command after ``sweeps.records restore`` skips it instead of running it
    again (seed 0 of each row; the other seeds differ only in the seed). Rows whose preset changed since
    (``CHANGED_SINCE``) run again, and only those keys differ from the recorded config."""
    import json

    import yaml
    from omegaconf import OmegaConf

    from laplace_lab.sweeps.run_only import hashed_config
    from laplace_lab.sweeps.status import unchanged_config
    from tests.conftest import compose_config

    status = json.loads(status_path.read_text())
    overrides = [o for o in status["overrides"] if not o.startswith("paths.")]  # run-only: <output_root> placeholders
    assert status["state"] == "finished"
    cfg = compose_config(overrides)
    recorded = _flat(hashed_config(yaml.safe_load((status_path.parent / "config_resolved.yaml").read_text())))
    now = _flat(hashed_config(OmegaConf.to_container(cfg, resolve=True)))
    changed = {k for k in recorded.keys() | now.keys() if k.split(".")[0] != "paths" and recorded.get(k) != now.get(k)}
    preset = next(o.split("=", 1)[1] for o in overrides if o.startswith("experiment="))
    assert changed <= CHANGED_SINCE.get(preset, set()), (overrides, sorted(changed))
    assert unchanged_config(status["config_hash"], cfg) == (not changed), (overrides, sorted(changed))
