"""Job records: carry a sweep's finished jobs across machines that do not keep ``outputs/``.

    python -m laplace_lab.sweeps.records save outputs/images250 results/sweeps
    python -m laplace_lab.sweeps.records restore results/sweeps outputs/images250

``save`` copies every *finished* job (``status.is_finished``) under the source folder, keeping its
path relative to that folder, with the text files that ``laplace_lab.tables`` and an audit need
(``RECORD_SUFFIXES``: ``status.json``, ``metrics.json``, the Hydra and resolved configs, the CSV
training curve) and its multirun folder's ``launches.jsonl`` / ``multirun.yaml`` / ``summary.json``.
Checkpoints, logs and figures stay behind. The machine's absolute paths in those files (the
checkout whose ``conf/`` the job ran, the folder it ran from, its data and output roots) are
replaced by ``<repo>``, ``<cwd>``, ``<data_dir>`` and ``<output_root>``, so a record names no
path of the machine that ran it; the paths are run-only keys, so neither the job's folder name
nor its ``config_hash`` depends on them.

``restore`` copies records back under an output root, never over an existing file. Relaunching
the sweep's commands with that output root then skips the restored jobs (finished, same config
hash) and runs the rest; ``tables`` reads restored and new jobs alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import yaml

from laplace_lab.sweeps.status import LAUNCH_LOG, STATUS_FILE, SUMMARY_FILE, is_finished

RECORD_SUFFIXES = (".json", ".jsonl", ".yaml", ".csv")
SKIP_DIRS = ("checkpoints", "wandb", "figures")
SWEEP_FILES = (LAUNCH_LOG, "multirun.yaml", SUMMARY_FILE)
TOKENS = {"repo": "<repo>", "cwd": "<cwd>", "data_dir": "<data_dir>", "output_root": "<output_root>"}


def _yaml(path: Path) -> dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def machine_roots(job_dir: Path) -> dict[str, str]:
    """{token: absolute path} of the machine paths a job's files contain: the checkout whose
    ``conf/`` it ran (Hydra's ``main`` config source), the folder it ran from
    (``hydra.runtime.cwd``), ``paths.data_dir`` and ``paths.output_root`` (relative ones are left:
    they name no machine)."""
    paths = _yaml(job_dir / "config_resolved.yaml").get("paths") or {}
    runtime = ((_yaml(job_dir / ".hydra" / "hydra.yaml").get("hydra") or {}).get("runtime") or {})
    conf = next((s.get("path") for s in runtime.get("config_sources") or [] if s.get("provider") == "main"), None)
    found = {"repo": os.path.dirname(os.path.normpath(conf)) if isinstance(conf, str) else None,
             "cwd": runtime.get("cwd"), "data_dir": paths.get("data_dir"), "output_root": paths.get("output_root")}
    return {TOKENS[k]: os.path.normpath(v) for k, v in found.items() if isinstance(v, str) and os.path.isabs(v)}


def scrub(text: str, roots: dict[str, str]) -> str:
    """``text`` with each root path replaced by its token (longest first, so a root under another
    keeps its own token)."""
    for token, root in sorted(roots.items(), key=lambda item: -len(item[1])):
        text = text.replace(root, token)
    return text


def record_files(job_dir: Path) -> list[Path]:
    """The job's files that go into its record (relative to ``job_dir``)."""
    out = []
    for path in sorted(job_dir.rglob("*")):
        rel = path.relative_to(job_dir)
        if path.is_file() and path.suffix in RECORD_SUFFIXES and not set(rel.parts[:-1]) & set(SKIP_DIRS):
            out.append(rel)
    return out


def finished_jobs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(STATUS_FILE) if is_finished(p.parent))


def save(source: Path, dest: Path) -> list[Path]:
    """Write the record of every finished job under ``source`` into ``dest`` (same relative
    paths), replacing older records of the same jobs. Returns the jobs saved."""
    source, dest = Path(source), Path(dest)
    if not source.is_dir():
        raise FileNotFoundError(f"source folder {source} does not exist")
    jobs = finished_jobs(source)
    sweep_dirs = set()
    for job in jobs:
        roots = machine_roots(job)  # a multirun's files name the roots of its jobs
        files = [job / rel for rel in record_files(job)]
        if job.parent not in sweep_dirs:
            sweep_dirs.add(job.parent)
            files += [job.parent / name for name in SWEEP_FILES if (job.parent / name).is_file()]
        for src in files:
            text = scrub(src.read_text(), roots)
            left = [root for root in roots.values() if root in text]
            if left:
                raise ValueError(f"{src}: machine path(s) {left} left after scrubbing")
            dst = dest / src.relative_to(source)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
    return jobs


def restore(records: Path, dest: Path) -> tuple[int, int]:
    """Copy the records under ``records`` into ``dest``, never over an existing file.
    Returns (files copied, files left because ``dest`` already had them)."""
    records, dest = Path(records), Path(dest)
    if not records.is_dir():
        raise FileNotFoundError(f"records folder {records} does not exist")
    copied = kept = 0
    for src in sorted(p for p in records.rglob("*") if p.is_file()):
        dst = dest / src.relative_to(records)
        if dst.exists():
            kept += 1
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        copied += 1
    return copied, kept


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m laplace_lab.sweeps.records", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save", help="record the finished jobs under SOURCE into DEST")
    s.add_argument("source", type=Path)
    s.add_argument("dest", type=Path)
    r = sub.add_parser("restore", help="copy the records under RECORDS into DEST (an output root)")
    r.add_argument("records", type=Path)
    r.add_argument("dest", type=Path)
    args = p.parse_args(argv)
    if args.command == "save":
        jobs = save(args.source, args.dest)
        print(json.dumps({"saved_jobs": len(jobs), "into": str(args.dest)}))
    else:
        copied, kept = restore(args.records, args.dest)
        print(json.dumps({"copied_files": copied, "already_there": kept, "into": str(args.dest)}))


if __name__ == "__main__":
    main()
