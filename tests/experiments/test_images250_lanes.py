"""experiments/immer2021_images/images250_lanes.py: its two lanes hold exactly the immer2021_images
preset's sweep plus the two smaller online-marglik candidates, and every job composes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

import laplace_lab.config  # noqa: F401  (registers the schema nodes and lab_if_equal)
from laplace_lab.config.load import load_run_config
from laplace_lab.sweeps.run_only import job_dirname
from tests.conftest import CONF_DIR, compose_config, load_script

ROOT = Path(__file__).resolve().parents[2]
lanes = load_script(ROOT / "experiments" / "immer2021_images" / "images250_lanes.py")


def _key(overrides: list[str]) -> tuple:
    o = dict(x.split("=", 1) for x in overrides)
    return o["data"], o["model"], o.get("model.widths"), o["method"], int(o["seed"])


def test_the_lanes_are_the_preset_sweep_plus_the_candidates():
    params = yaml.safe_load((CONF_DIR.parent / "experiments" / "immer2021_images" / "preset.yaml").read_text())["hydra"]["sweeper"]["params"]
    grid = {(d, m, None, meth, int(s)) for d, m, meth, s in itertools.product(
        *(params[k].split(",") for k in ("data", "model", "method", "seed")))}
    candidates = {(d, "mlp", w, "online_kron", s) for d in lanes.DATA for w in ("[50]", "[100,100]") for s in lanes.SEEDS}
    jobs = [job for data in lanes.DATA for job in lanes.lane_jobs(data)]
    assert len(jobs) == 48 and {_key(j) for j in jobs} == grid | candidates
    assert len({job_dirname(j) for j in jobs}) == 48  # one folder each
    for data in lanes.DATA:  # a lane is one set, online marglik first
        keys = [_key(j) for j in lanes.lane_jobs(data)]
        assert {k[0] for k in keys} == {data} and [k[3] for k in keys[:12]] == ["online_kron"] * 12


@pytest.mark.parametrize("data", lanes.DATA)
def test_every_job_composes_with_the_authors_recipe(data):
    for overrides in lanes.lane_jobs(data):
        cfg = compose_config(overrides)
        load_run_config(cfg)
        assert cfg.trainer.max_epochs == 250 and cfg.data.batch_size == 128


def test_print_and_bad_arguments(tmp_path, capsys):
    assert lanes.main(["--checkout", str(ROOT), "--output-root", str(tmp_path), "--data", "mnist", "--print"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 24 and all(line.endswith(f"paths.output_root={tmp_path}") for line in lines)
    with pytest.raises(SystemExit):
        lanes.main(["--checkout", str(tmp_path), "--output-root", str(tmp_path), "--print"])
    with pytest.raises(ValueError, match="allowed"):
        lanes.lane_jobs("cifar10")
