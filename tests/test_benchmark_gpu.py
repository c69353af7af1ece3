"""``benchmarks/gpu.py``: its smoke form runs on the CPU without Hydra, OmegaConf, wandb or
torchvision (the GPU machine lacks them), writes every row to its JSON file, and a failing row is
reported instead of stopping the script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
BLOCKED = ("hydra", "omegaconf", "wandb", "torchvision", "pytorch_lightning", "lightning")


def _load():
    return load_script(SCRIPT, "benchmark_gpu")


def test_smoke_runs_on_cpu_without_the_missing_packages(tmp_path):
    out = tmp_path / "smoke.json"
    blocker = "import sys, runpy; " + "".join(f"sys.modules[{m!r}] = None; " for m in BLOCKED)
    code = blocker + f"sys.argv = ['gpu.py', '--device', 'cpu', '--smoke', '--peers', 'none', '--threads', '1', " \
                     f"'--out', {str(out)!r}]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {r["part"] for r in rows} == {"wrn", "lenet", "predictive", "marglik"}
    assert not [r for r in rows if "error" in r], [r["error"] for r in rows if "error" in r]
    for r in rows:
        assert r["seconds"] > 0 and r["runs"] >= 1
    margliks = [r["log_marglik"] for r in rows if "log_marglik" in r]
    assert len(margliks) == 6 and all(torch.isfinite(torch.tensor(margliks)))
    assert result["prob_diffs"]["ours, engine default (TF32 off inside), TF32 switches on vs float64"] < 1e-5
    assert "| impl | median s |" in proc.stdout and "benchmarks/gpu.py on CPU" in proc.stdout


def test_a_failing_row_is_reported_and_the_run_goes_on():
    gpu = _load()
    runner = gpu.Runner(torch.device("cpu"), repeats=2, budget_s=5.0, time_limit_s=60.0)

    def broken():
        raise RuntimeError("CUDA out of memory (simulated)")

    bad = runner.row("wrn", "work", "laplace-torch curvlinops", broken)
    good = runner.row("wrn", "work", "ours", lambda: {"log_marglik": -1.0})
    assert bad["error"].startswith("RuntimeError: CUDA out of memory") and "seconds" not in bad
    assert good["runs"] == 2 and good["log_marglik"] == -1.0
    table = gpu.markdown(runner, ["# header"], {})
    assert "CUDA out of memory (simulated)" in table and "| ours |" in table


def test_rows_past_the_time_limit_are_skipped():
    gpu = _load()
    runner = gpu.Runner(torch.device("cpu"), repeats=1, budget_s=1.0, time_limit_s=0.0)
    row = runner.row("lenet", "work", "ours", lambda: None)
    assert row["error"].startswith("skipped: past --time-limit-s")


def test_mnist_idx_reader_reads_gz_and_raw(tmp_path):
    gpu = _load()
    import gzip

    images = torch.arange(2 * 28 * 28, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(2, 28, 28)
    header = bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in (2, 28, 28))
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + images.numpy().tobytes()))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big") + bytes([3, 7]))
    X, y, source = gpu.mnist(str(tmp_path), True, 2, torch.device("cpu"))
    assert source == "MNIST" and y.tolist() == [3, 7]
    assert torch.allclose(X * 0.3081 + 0.1307, images.float().div(255).unsqueeze(1), atol=1e-6)
    _, _, fallback = gpu.mnist(str(tmp_path), False, 2, torch.device("cpu"))
    assert fallback.startswith("random")
