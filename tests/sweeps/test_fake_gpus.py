"""Sweeps across GPUs without a GPU: Ray on a faked 4-GPU node, and the SLURM array
that submitit would submit.

Ray hands out GPU ids from ``ray.init(num_gpus=4)`` and sets ``CUDA_VISIBLE_DEVICES`` in each
job's worker whether or not CUDA exists, so the scheduling (one job per GPU, or two per GPU with
``num_gpus: 0.5``) is testable on a CPU machine. One Ray node serves every test of this module:
its start-up is the slow part. Jobs go through ``tests/sweeps/barrier_app.py`` (the real
``run_tracked``, with a barrier that proves which jobs overlap).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laplace_lab.sweeps.status import read_devices, read_status
from tests.sweeps.helpers import TINY, multirun, require_plugin, summary

APP = str(Path(__file__).with_name("barrier_app.py"))
N_GPUS = 4
HOLDER = f"""
import sys, ray
ray.init(num_cpus=8, num_gpus={N_GPUS}, include_dashboard=False, object_store_memory=78643200)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes stdin
ray.shutdown()
"""


@pytest.fixture(scope="module")
def ray_node():
    """The address of a local Ray node with 8 CPUs and 4 (fake) GPUs, shut down after the module."""
    require_plugin("hydra_plugins.hydra_ray_launcher")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}  # a local test node
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    address = proc.stdout.readline().strip()
    if not address:
        proc.kill()
        pytest.fail(f"the Ray node did not start (exit {proc.wait()})")
    yield address
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def ray_sweep(tmp_path: Path, address: str, n_jobs: int, gpus_per_job: float, barrier: int, light: bool,
              hold_s: float = 0.0):
    barrier_dir = tmp_path / "barrier"
    barrier_dir.mkdir()
    env_set = {"LAB_BARRIER_DIR": barrier_dir, "LAB_BARRIER_N": barrier, "LAB_HOLD_S": hold_s,
               "LAB_LIGHT": int(light)}
    proc, sweep = multirun(
        tmp_path, "hydra/launcher=ray", f"hydra.launcher.ray.init.address={address}",
        "hydra.launcher.ray.init.object_store_memory=null", f"hydra.launcher.ray.remote.num_gpus={gpus_per_job}",
        *(f"++hydra.job.env_set.{k}='{v}'" for k, v in env_set.items()),
        *TINY, f"seed={','.join(map(str, range(n_jobs)))}", script=APP, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = summary(sweep)
    assert s["counts"]["finished"] == n_jobs, s
    return [sweep / job for job in s["finished"]]


def intervals(jobs: list[Path]) -> list[tuple[float, float, str]]:
    out = []
    for job in jobs:
        status = read_status(job)
        out.append((status["started_unix"], status["ended_unix"], read_devices(job)["cuda_visible_devices"]))
    return out


def max_overlap(spans: list[tuple[float, float, str]]) -> int:
    """The largest number of jobs running at one instant."""
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans], key=lambda t: (t[0], t[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.slow  # a Ray node start-up and four workers: ~50-100 s of the default run (make test-slow)
def test_ray_four_jobs_on_four_gpus_run_at_once_each_on_its_own_gpu(tmp_path, ray_node):
    jobs = ray_sweep(tmp_path, ray_node, n_jobs=4, gpus_per_job=1, barrier=4, light=False)
    spans = intervals(jobs)
    assert max(s for s, _, _ in spans) < min(e for _, e, _ in spans)  # all four ran at the same time
    assert sorted(d for _, _, d in spans) == ["0", "1", "2", "3"]
    for job in jobs:  # the real job ran and recorded what it used (CPU here: no CUDA behind the fake GPUs)
        devices = read_devices(job)
        assert devices["torch_device"] == "cpu" and devices["accelerator"] == "cpu" and devices["device_ids"] == "0"
        assert (job / "metrics.json").is_file()


@pytest.mark.slow  # queueing past the GPU count: ~80 s on the busy 2-core machine (make test-slow)
def test_ray_eight_jobs_on_four_gpus_run_at_most_four_at_once(tmp_path, ray_node):
    jobs = ray_sweep(tmp_path, ray_node, n_jobs=8, gpus_per_job=1, barrier=4, light=True, hold_s=1.0)
    spans = intervals(jobs)
    assert max_overlap(spans) == N_GPUS
    for (s1, e1, d1), (s2, e2, d2) in itertools.combinations(spans, 2):
        if s1 < e2 and s2 < e1:  # two jobs that overlapped never shared a GPU
            assert d1 != d2
    assert {d for _, _, d in spans} == {"0", "1", "2", "3"}


@pytest.mark.slow  # eight Ray workers at once: ~70 s on the busy 2-core machine; run with make test-slow like the two above
def test_ray_half_a_gpu_per_job_puts_two_jobs_on_each_gpu(tmp_path, ray_node):
    jobs = ray_sweep(tmp_path, ray_node, n_jobs=8, gpus_per_job=0.5, barrier=8, light=True)
    spans = intervals(jobs)
    assert max_overlap(spans) == 8  # all eight at once on four GPUs
    per_gpu = sorted(d for _, _, d in spans)
    assert per_gpu == ["0", "0", "1", "1", "2", "2", "3", "3"]


def _capture_submission(tmp_path, monkeypatch, launcher_overrides: list[str], job_overrides: list[list[str]]):
    """What ``hydra/launcher=submitit_slurm`` with ``launcher_overrides`` submits for ``job_overrides``,
    captured instead of sbatch: ``{"sbatch": <script text>, "folder": <submitit folder>}``."""
    require_plugin("hydra_plugins.hydra_submitit_launcher")
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from laplace_lab.config import CONF_DIR

    class Submitted(Exception):
        pass

    captured = {}

    def fake_submit(self, command):  # SlurmExecutor._submit_command: where sbatch would run
        captured["sbatch"] = self._make_submission_file_text(command, "uid")
        captured["folder"] = Path(self.folder)
        raise Submitted

    monkeypatch.setattr(submitit.SlurmExecutor, "_submit_command", fake_submit)
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # "srun is on PATH"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", ["hydra/launcher=submitit_slurm", *launcher_overrides,
                                f"hydra.sweep.dir={tmp_path / 'sweep'}"], return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.config = cfg
    with pytest.raises(Submitted):
        launcher.launch(job_overrides, initial_job_idx=0)
    return captured


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/\w+/\w+' is validated against ConfigStore schema")
def test_slurm_array_submission(tmp_path, monkeypatch):
    """What ``hydra/launcher=submitit_slurm`` submits for a 3-job sweep, captured instead of sbatch:
    the resources of the array and each job's overrides."""
    from submitit.core.utils import DelayedSubmission

    from laplace_lab.sweeps.run_only import job_dirname

    sweep_dir = tmp_path / "sweep"
    job_overrides = [["data=toy2d", f"seed={seed}", "optimizer.lr=0.01"] for seed in range(3)]
    captured = _capture_submission(tmp_path, monkeypatch, [
        "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=2", "hydra.launcher.cpus_per_task=6",
        "hydra.launcher.mem_gb=48", "hydra.launcher.timeout_min=90", "hydra.launcher.array_parallelism=2",
        "experiment_name=slurm_test"], job_overrides)

    lines = set(captured["sbatch"].splitlines())
    for flag in ("--gpus-per-node=2", "--cpus-per-task=6", "--mem=48GB", "--time=90", "--array=0-2%2",
                 "--partition=gpu", "--nodes=1", "--ntasks-per-node=1", "--job-name=slurm_test"):
        assert f"#SBATCH {flag}" in lines, (flag, captured["sbatch"])
    assert any("submitit.core._submit" in line for line in lines)
    # The pickled jobs of the array, one per task: the launcher called with each job's overrides.
    assert captured["folder"] == sweep_dir / ".submitit" / "%j"
    calls = [DelayedSubmission.load(p) for p in (sweep_dir / ".submitit").glob("*.pkl")]
    assert len(calls) == 3
    got = sorted((c.args[2], c.args[0]) for c in calls)  # (job number, overrides)
    assert got == [(i, job_overrides[i]) for i in range(3)]
    assert all(c.args[1] == "hydra.sweep.dir" for c in calls)
    assert [job_dirname(o) for _, o in got] == [f"data=toy2d,optimizer.lr=0.01,seed={i}" for i in range(3)]


@pytest.mark.filterwarnings(r"ignore:\s*'hydra/\w+/\w+' is validated against ConfigStore schema")
def test_slurm_ddp_submission(tmp_path, monkeypatch):
    """A multi-node DDP job (docs/gpu.md): 2 nodes x 4 tasks, one task per GPU, all started by srun,
    with the trainer overrides that Lightning's SLURM environment checks against them."""
    from submitit.core.utils import DelayedSubmission

    job = ["trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"]
    captured = _capture_submission(tmp_path, monkeypatch, [
        "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4", "hydra.launcher.gpus_per_node=4",
        "hydra.launcher.cpus_per_task=8"], [job])
    lines = set(captured["sbatch"].splitlines())
    for flag in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--cpus-per-task=8"):
        assert f"#SBATCH {flag}" in lines, (flag, captured["sbatch"])
    assert any(line.startswith("srun ") and "submitit.core._submit" in line for line in lines), captured["sbatch"]
    calls = [DelayedSubmission.load(p) for p in (tmp_path / "sweep" / ".submitit").glob("*.pkl")]
    assert [c.args[0] for c in calls] == [job]
