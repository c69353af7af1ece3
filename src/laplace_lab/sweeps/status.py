"""The ``status.json`` marker of a job folder, the sweep's launch log, and run provenance.

A job folder is *finished* when it holds ``metrics.json`` and a ``status.json`` whose ``state``
is ``finished``; ``running`` (killed jobs keep it) and ``failed`` (with the traceback) are run
again by the next launch of the same multirun. The marker also stores ``config_hash``
(``config_fingerprint``): a finished job whose config has changed since (e.g. an edited preset,
which does not change the folder name) is run again rather than skipped. ``<sweep dir>/launches.jsonl`` has one line per
launch (id, command, start time); each job stamps the id of the launch that ran it (handed to it
in its config, ``job_launch_id``) into its marker as ``launch_id``, and the id of the last launch
that ran or skipped it as ``last_launch_id`` (read with ``last_launch_id()``), which is how the end-of-sweep
summary tells this launch's jobs from older ones while the table's provenance keeps the command
that ran the job. ``status.json["devices"]`` records the job's devices
(``read_devices``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
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

from laplace_lab.io.atomic import write_json_atomic  # noqa: F401 - re-exported (sweeps.callback uses it)

# RUN_ONLY_KEYS / RUN_ONLY_SUBKEYS are re-exported: the one list lives in sweeps.run_only.
from laplace_lab.sweeps.run_only import (  # noqa: F401
    RUN_ONLY_KEYS,
    RUN_ONLY_SUBKEYS,
    WIRING_KEYS,
    hashed_config,
    strip_run_only,
)

log = logging.getLogger(__name__)
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.json"
LAUNCH_LOG = "launches.jsonl"
SUMMARY_FILE = "summary.json"
IMMUTABLE_SKIPS = "skipped_immutable.jsonl"  # finished jobs skipped in folders that cannot be written
STATES = ("running", "finished", "failed")
REPO_ROOT = Path(__file__).resolve().parents[3]
ENTRY = "python -m laplace_lab.train"
# Set (through ``hydra.job.env_set``) by the SweepSummary callback for every job of a launch.
LAUNCH_ENV = "LAPLACE_LAB_LAUNCH_ID"
# ``status.json["devices"]``: what the job was given and used (``sweeps.devices.device_record``).
DEVICE_FIELDS = ("cuda_visible_devices", "torch_device", "accelerator", "device_ids", "cuda_device_names")


def config_fingerprint(cfg: Any) -> str:
    """Stable hash of the resolved job config less its run-only keys (``run_only.strip_run_only``) and
    the nodes that only name objects and the switched-off features (``run_only.hashed_config``)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    data = hashed_config(data)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def earlier_fingerprint(cfg: Any) -> str:
    """The hash of ``cfg`` in its earlier form, which still covered the switched-off nodes and the
    added options at their default (``run_only.SWITCHED_OFF``, ``ADDED_AT_DEFAULT``): what jobs
    finished before they were left out recorded."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    data = {k: v for k, v in strip_run_only(data).items() if k not in WIRING_KEYS and k != "hydra"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def unchanged_config(recorded_hash: str, cfg: Any) -> bool:
    """Whether a finished job's ``config_hash`` is the hash of ``cfg``, in today's form or the earlier
    one (``earlier_fingerprint``): a job finished before switched-off nodes and added options left the
    hash is skipped, not run again."""
    return recorded_hash in (config_fingerprint(cfg), earlier_fingerprint(cfg))


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def read_json_file(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)``, or ``(None, why)`` when the file is missing, unreadable, not JSON (e.g.
    cut off by a killed writer) or not a JSON object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, UnicodeDecodeError) as err:
        return None, f"{path.name} cannot be read ({err})"
    except ValueError as err:
        return None, f"{path.name} is not valid JSON ({err})"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a JSON object"
    return data, None


def read_status(job_dir: str | Path) -> dict[str, Any] | None:
    """The job's marker, or None when it has none (or an unreadable one)."""
    return read_json_file(Path(job_dir) / STATUS_FILE)[0]


def read_metrics(job_dir: str | Path) -> dict[str, Any] | None:
    """The job's ``metrics.json``, or None when it has none (or an unreadable one)."""
    return read_json_file(Path(job_dir) / METRICS_FILE)[0]


def set_aside_unreadable(job_dir: str | Path) -> list[Path]:
    """Rename the job's unreadable ``status.json`` / ``metrics.json`` (a truncated file of a killed
    writer) to ``<name>.unreadable-<time>``, logging each; the job then counts as unfinished and runs
    again. Returns the new paths."""
    moved = []
    for name in (STATUS_FILE, METRICS_FILE):
        path = Path(job_dir) / name
        if not path.exists():
            continue
        _, why = read_json_file(path)
        if why is None:
            continue
        aside = path.with_name(f"{name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
        os.replace(path, aside)
        log.warning("%s: %s; moved aside to %s, the job runs again", path, why, aside.name)
        moved.append(aside)
    return moved


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
    """True when the folder holds a finished run: a readable ``metrics.json`` and state ``finished``."""
    status = read_status(job_dir)
    return bool(status) and status.get("state") == "finished" and read_metrics(job_dir) is not None


def job_seconds(status: dict[str, Any], metrics: dict[str, Any]) -> tuple[float, str]:
    """(seconds, source) of one job from its status.json and metrics.json: the wall clock of its
    last launch (source ``job``), else its training time (``fit``); plus, for a job resumed from a
    checkpoint, the training seconds of the launches before it (``checkpoint/resumed_fit_s``)."""
    earlier = float(metrics.get("checkpoint/resumed_fit_s", 0.0))
    if status.get("wall_s") is not None:
        return float(status["wall_s"]) + earlier, "job"
    return float(metrics.get("time/fit_s", math.nan)), "fit"  # (time/fit_s already counts the earlier launches)


def launch_command(argv: list[str] | None = None) -> str:
    """The command line of this process, as ``python -m laplace_lab.train ...`` when it is that."""
    argv = list(sys.argv if argv is None else argv)
    head = ENTRY if argv and Path(argv[0]).name in ("train.py", "laplace-lab-train", "__main__.py") else argv[0]
    return " ".join([head, *map(shlex.quote, argv[1:])]) if argv else ENTRY


def new_launch() -> dict[str, Any]:
    """A new launch record: id, start time, command, cwd, host."""
    return {"launch_id": uuid.uuid4().hex[:12], "started": now_iso(), "command": launch_command(),
            "cwd": os.getcwd(), "host": socket.gethostname()}


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line to ``path`` (one write: parallel writers do not mix their lines;
    after a cut-off last line, on a line of its own)."""
    with open(path, "ab+") as f:
        cut_off = False
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            cut_off = f.read(1) != b"\n"
        f.write((("\n" if cut_off else "") + json.dumps(record) + "\n").encode())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one a line (none when it does not exist); a line that is not one
    (e.g. cut off by a killed writer) is left out with a warning naming the file and the line."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            record, why = None, f"not valid JSON ({err})"
        else:
            why = None if isinstance(record, dict) else "not a JSON object"
        if why:
            log.warning("%s: line %d left out: %s", path, number, why)
            continue
        records.append(record)
    return records


def record_launch(sweep_dir: str | Path, launch: dict[str, Any] | None = None) -> dict[str, Any]:
    """Append ``launch`` (default: a ``new_launch()``) to ``<sweep dir>/launches.jsonl``; returns it."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    launch = launch or new_launch()
    append_jsonl(sweep_dir / LAUNCH_LOG, launch)
    return launch


def read_launches(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The launch records of ``<sweep dir>/launches.jsonl`` (``read_jsonl``)."""
    return read_jsonl(Path(sweep_dir) / LAUNCH_LOG)


def record_immutable_skip(sweep_dir: str | Path, launch_id: str | None, job: str, error: str) -> None:
    """Note in ``<sweep dir>/skipped_immutable.jsonl`` that launch ``launch_id`` skipped the finished
    job ``job`` (its folder relative to the sweep folder) without stamping its ``status.json``
    (a folder that cannot be written: ``error``), so the summary still counts it."""
    append_jsonl(Path(sweep_dir) / IMMUTABLE_SKIPS, {"launch_id": launch_id, "job": job, "error": error,
                                                      "at": now_iso()})


def immutable_skips(sweep_dir: str | Path, launch_id: str | None) -> list[str]:
    """The jobs that launch ``launch_id`` skipped without stamping them (``record_immutable_skip``), sorted."""
    records = read_jsonl(Path(sweep_dir) / IMMUTABLE_SKIPS)
    return sorted({str(r.get("job")) for r in records if r.get("launch_id") == launch_id and r.get("job")})


def job_launch_id(hydra_cfg: Any) -> str | None:
    """The id of the launch that started this job: ``hydra.job.env_set.LAPLACE_LAB_LAUNCH_ID`` (set
    per launch by the SweepSummary callback, so concurrent launches cannot mix them up), else the
    environment variable; None when the callback is off."""
    env_set = hydra_cfg.job.get("env_set") or {}
    return env_set.get(LAUNCH_ENV) or os.environ.get(LAUNCH_ENV)


def last_launch_id(status: dict[str, Any]) -> str | None:
    """The id of the last launch that ran or skipped the job of marker ``status``. Markers written
    before ``last_launch_id`` existed have only ``launch_id``, which a skip then overwrote."""
    return status.get("last_launch_id", status.get("launch_id"))


def device_texts(status: dict[str, Any]) -> dict[str, str | None]:
    """A job marker's ``devices`` as text, one entry per ``DEVICE_FIELDS`` (None where not recorded),
    for grouping or reporting by device (``tables --group-by devices.<field>``): e.g.
    ``{"cuda_visible_devices": "2", "torch_device": "cuda:0", "accelerator": "cuda", "device_ids": "0",
    "cuda_device_names": "NVIDIA H100"}``."""
    devices = status.get("devices") or {}

    def text(value: Any) -> str | None:
        if value is None:
            return None
        return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    return {key: text(devices.get(key)) for key in DEVICE_FIELDS}


def read_devices(job_dir: str | Path) -> dict[str, str | None]:
    """``device_texts`` of the job folder's marker."""
    return device_texts(read_status(job_dir) or {})


# Untracked and ignored files under these folders are part of the package (a data loader, a
# config; the Hydra files of the preset folders, experiments/<preset>/*.yaml) and make the tree
# dirty, less the caches below. Untracked files elsewhere (a user's own scratch/ folder) do not: no
# preset reads them. Python files at the top level do, untracked or ignored: ``python -m`` from the
# checkout can import them (``git_state``).
PACKAGE_PATHS = ("src/laplace_lab", "conf", ":(glob)experiments/*/*.yaml")
IGNORED_CACHES = ("__pycache__", ".pyc", ".egg-info")


def git_state(repo_root: str | Path = REPO_ROOT) -> dict[str, Any]:
    """``{"commit", "dirty", "dirty_files", "ignored_checked"}`` of the repository this package runs from.

    Dirty: a change to a tracked file anywhere; an untracked or ignored file under ``PACKAGE_PATHS``
    (less ``IGNORED_CACHES``); an untracked or ignored ``.py`` file at the top level. Untracked
    files elsewhere (one's own folder, e.g. ``scratch/``) leave the tree clean. ``dirty_files``
    lists the first 20 porcelain lines that make it dirty. ``commit`` / ``dirty`` are None outside
    a git checkout (or without git)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    porcelain = git("status", "--porcelain", "--untracked-files=no") if commit else None
    # untracked ("??") and ignored ("!!") files of the package, one line per file
    package = git("status", "--porcelain", "--ignored", "--untracked-files=all", "--", *PACKAGE_PATHS,
                  ":(glob)*.py") if commit else None
    if porcelain is None or package is None:
        return {"commit": commit.strip() if commit else None, "dirty": None, "dirty_files": [],
                "ignored_checked": False}
    files = [line for line in porcelain.splitlines() if line.strip()]
    files += [line for line in package.splitlines() if line.startswith(("?? ", "!! "))
              and not any(part == "__pycache__" or part.endswith(IGNORED_CACHES) for part in line[3:].split("/"))]
    return {"commit": commit.strip(), "dirty": bool(files), "dirty_files": files[:20], "ignored_checked": True}


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
