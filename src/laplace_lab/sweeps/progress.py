"""How far a sweep has come: one line per job, for sweeps that take several launches.

    python -m laplace_lab.sweeps.progress outputs/immer2021_images

Every folder under the given ones that holds a ``status.json`` is a job. Its line gives its
state (``finished``, ``failed``, ``running`` while its process is alive on this host, ``cut off``
when the process that marked it running is gone, ``unreadable`` when its ``status.json`` or, once
finished, its ``metrics.json`` does not parse), the epoch its newest ``last.ckpt`` saved out of
``trainer.max_epochs`` (``map_grid``: per grid point, ``grid_<delta>/checkpoints``), and its wall
time (a resumed job's includes the training seconds of its launches before the resume). A cut-off
job with a checkpoint continues from that epoch when its launch command runs again with
``checkpoint.resume_from=last``; one without restarts from its first epoch.

A running or cut-off job's line also gives its phase, epoch and estimated time left, as its
``progress.json`` last recorded them (``sweeps.job_progress``). Single runs (``status.json``
without a state) are named from their files: finished with ``metrics.json``, running while their
process is alive.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from laplace_lab.sweeps.status import STATUS_FILE, is_finished, job_seconds, read_json_file


def saved_epochs(job_dir: Path) -> dict[str, int]:
    """Epochs completed in each ``last.ckpt`` under ``job_dir`` (key: its training's folder
    relative to the job, ``.`` for the job's own), read from the checkpoint's ``epoch``. Read with
    ``weights_only=True``: a checkpoint may come from elsewhere (restored records, a shared folder),
    and a pickle payload must not run; one that does not load is left out."""
    import torch

    out = {}
    for path in sorted(job_dir.glob("**/checkpoints/last.ckpt")):
        try:
            epoch = torch.load(path, map_location="cpu", weights_only=True)["epoch"]
        except Exception:  # noqa: BLE001 - a file being written, cut off, or not a plain checkpoint
            continue
        out[str(path.parent.parent.relative_to(job_dir))] = int(epoch) + 1
    return out


def _alive(status: dict) -> bool:
    if status.get("host") != socket.gethostname() or not status.get("pid"):
        return False
    try:
        os.kill(int(status["pid"]), 0)
    except (OSError, ValueError):
        return False
    return True


def job_state(job_dir: Path, status: dict) -> str:
    """``finished`` | ``failed`` | ``running`` (its process is alive here) | ``cut off``."""
    if "state" not in status:  # a single run
        from laplace_lab.sweeps.job_progress import single_run_state

        return single_run_state(job_dir)
    if is_finished(job_dir):
        return "finished"
    if status.get("state") == "failed":
        return "failed"
    return "running" if _alive(status) else "cut off"


def max_epochs(job_dir: Path) -> int | None:
    """``trainer.max_epochs`` of the job's ``config_resolved.yaml`` (None if absent or unreadable)."""
    path = job_dir / "config_resolved.yaml"
    if not path.is_file():
        return None
    import yaml

    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    value = ((config or {}).get("trainer") or {}).get("max_epochs") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None


def job_line(job_dir: Path, root: Path) -> tuple[str, str]:
    """(state, the job's line); ``unreadable`` (with why) for a ``status.json`` that does not parse
    or is missing (but for a single run still training: it has a ``progress.json``)."""
    status, why = read_json_file(job_dir / STATUS_FILE)
    from laplace_lab.sweeps.job_progress import PROGRESS_FILE

    if why and not (job_dir / STATUS_FILE).exists() and (job_dir / PROGRESS_FILE).is_file():
        status, why = {}, ""  # a single run writes its status.json only once trained
    if why:
        return "unreadable", f"{'unreadable':9s} {job_dir.relative_to(root)}  ({why}; a relaunch moves it aside and runs the job)"
    metrics, why = read_json_file(job_dir / "metrics.json")
    if status.get("state") == "finished" and why:
        return "unreadable", f"{'unreadable':9s} {job_dir.relative_to(root)}  (state finished, but {why}; a relaunch moves it aside and runs the job)"
    state = job_state(job_dir, status)
    total = max_epochs(job_dir)
    epochs = saved_epochs(job_dir) if state != "finished" else {}
    saved = ", ".join(f"{'' if k == '.' else k + ' '}{v}/{total or '?'}" for k, v in epochs.items())
    # the phase, epoch and ETA of progress.json
    from laplace_lab.sweeps.job_progress import progress_text

    now = progress_text(job_dir, state) if state in ("running", "cut off") else ""
    wall = ""
    if state == "finished" and status.get("wall_s") is not None:  # with the launches before a resume
        wall = f"{job_seconds(status, metrics)[0]:.0f} s"
    detail = "; ".join(x for x in (now, f"epochs saved: {saved}" if saved else "", wall) if x)
    return state, f"{state:9s} {job_dir.relative_to(root)}" + (f"  ({detail})" if detail else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m laplace_lab.sweeps.progress", description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="sweep folders, or folders holding sweep folders")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    counts: dict[str, int] = {}
    for root in args.folders:
        # the folders of status.json files, and of single runs before their status.json
        from laplace_lab.sweeps.job_progress import job_dirs

        for job_dir in job_dirs(root, STATUS_FILE):
            try:
                state, line = job_line(job_dir, root)
            except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as err:  # a malformed record
                state, line = "unreadable", (f"{'unreadable':9s} {job_dir.relative_to(root)}  ({type(err).__name__}: "
                                             f"{err}; the other jobs are listed)")
            counts[state] = counts.get(state, 0) + 1
            print(line)
    print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no jobs found")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
