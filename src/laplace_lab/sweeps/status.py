"""The ``status.json`` marker of a job folder, the sweep's launch log, and run provenance.

A job folder is *finished* when it holds ``metrics.json`` and a ``status.json`` whose ``state``
is ``finished``; ``running`` (killed jobs keep it) and ``failed`` (with the traceback) are run
again by the next launch of the same multirun. The marker also stores ``config_hash``
(``config_fingerprint``): a finished job whose config has changed since (e.g. an edited preset,
which does not change the folder name) is run again rather than skipped. ``<sweep dir>/launches.jsonl`` has one line per
launch (id, command, start time); a job stamps the current launch id into its marker, which is how
the end-of-sweep summary tells this launch's jobs from older ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from laplace_lab import run_only

STATUS_FILE = "status.json"
LAUNCH_LOG = "launches.jsonl"
SUMMARY_FILE = "summary.json"
STATES = ("running", "finished", "failed")
REPO_ROOT = Path(__file__).resolve().parents[3]
ENTRY = "python -m laplace_lab.train"


# Config keys that do not change a run's result: one list (laplace_lab.run_only) for this hash,
# the MAP cache key and hydra.job.config.override_dirname.exclude_keys (job folder names).
RUN_ONLY_KEYS, RUN_ONLY_SUBKEYS = run_only.RUN_ONLY_KEYS, run_only.RUN_ONLY_SUBKEYS


def config_fingerprint(cfg: Any) -> str:
    """Stable hash of the resolved job config less ``RUN_ONLY_KEYS`` / ``RUN_ONLY_SUBKEYS``."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    data = run_only.strip_run_only(data)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def read_status(job_dir: str | Path) -> dict[str, Any] | None:
    """The job's marker, or None when it has none (or an unreadable one)."""
    try:
        return json.loads((Path(job_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_status(job_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Update the job's marker with ``fields`` (``state`` must be one of ``STATES``)."""
    state = fields.get("state")
    if state is not None and state not in STATES:
        raise ValueError(f"state={state!r} is not supported; allowed: {list(STATES)}")
    record = read_status(job_dir) or {}
    record.update(fields)
    write_json_atomic(Path(job_dir) / STATUS_FILE, record)
    return record


def is_finished(job_dir: str | Path) -> bool:
    """True when the folder holds a finished run: ``metrics.json`` and state ``finished``."""
    status = read_status(job_dir)
    return bool(status) and status.get("state") == "finished" and (Path(job_dir) / "metrics.json").is_file()


def launch_command(argv: list[str] | None = None) -> str:
    """The command line of this process, as ``python -m laplace_lab.train ...`` when it is that."""
    argv = list(sys.argv if argv is None else argv)
    head = ENTRY if argv and Path(argv[0]).name in ("train.py", "laplace-lab-train", "__main__.py") else argv[0]
    return " ".join([head, *map(shlex.quote, argv[1:])]) if argv else ENTRY


def record_launch(sweep_dir: str | Path) -> dict[str, Any]:
    """Append a new launch (id, command, cwd, start time, host) to ``<sweep dir>/launches.jsonl``."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    launch = {"launch_id": uuid.uuid4().hex[:12], "started": now_iso(), "command": launch_command(),
              "cwd": os.getcwd(), "host": socket.gethostname()}
    with open(sweep_dir / LAUNCH_LOG, "a") as f:
        f.write(json.dumps(launch) + "\n")
    return launch


def read_launches(sweep_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(sweep_dir) / LAUNCH_LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def current_launch_id(sweep_dir: str | Path) -> str | None:
    launches = read_launches(sweep_dir)
    return launches[-1]["launch_id"] if launches else None


def git_state() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the repository this package runs from."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    porcelain = git("status", "--porcelain") if commit else None
    return {"commit": commit.strip() if commit else None,
            "dirty": None if porcelain is None else bool(porcelain.strip())}


def hardware() -> dict[str, Any]:
    """Platform, CPU count, torch version and the CUDA device name (None on CPU-only runs)."""
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.processor() or None,
                            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover
        info["torch"] = info["cuda_device"] = None
    return info
