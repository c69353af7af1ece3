"""The committed tables' provenance: each results/<name>.md says one clean commit, its .jobs.csv agrees
job by job, and that commit contains the preset its jobs were launched with."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

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
        found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:conf/experiment/{preset}.yaml"],
                               capture_output=True)
        assert found.returncode == 0, f"{table.name}: commit {commit[:12]} has no conf/experiment/{preset}.yaml"


RECORDS = sorted((ROOT / "results" / "sweeps").glob("**/status.json"))


@pytest.mark.parametrize("status_path", [p for p in RECORDS if "seed=0" in p.parent.name],
                         ids=lambda p: p.parent.name)
def test_a_relaunch_of_a_committed_sweep_skips_its_finished_jobs(status_path):
    """Each committed job record's overrides compose to the config hash it recorded (``config_hash`` in
    ``status.json``), so relaunching its command after ``sweeps.records restore`` skips it instead of
    running it again (seed 0 of each row; the other seeds differ only in the seed)."""
    import json

    from laplace_lab.sweeps.status import config_fingerprint
    from tests.conftest import compose_config

    status = json.loads(status_path.read_text())
    overrides = [o for o in status["overrides"] if not o.startswith("paths.")]  # run-only: <output_root> placeholders
    assert status["state"] == "finished"
    assert config_fingerprint(compose_config(overrides)) == status["config_hash"], overrides
