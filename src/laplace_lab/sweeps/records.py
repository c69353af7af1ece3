"""Job records: carry a sweep's finished jobs across machines that do not keep ``outputs/``.

    python -m laplace_lab.sweeps.records save outputs/images250 results/sweeps
    python -m laplace_lab.sweeps.records restore results/sweeps outputs/images250

``save`` copies every *finished* job (``status.is_finished``) under the source folder, keeping its
path relative to that folder, with the text files that ``laplace_lab.reporting.tables`` and an audit need
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
from collections.abc import Iterable
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


def config_roots(hydra_config: dict, paths: dict) -> dict[str, str]:
    """{token: absolute path} of the machine paths named by a Hydra config (its ``hydra`` block:
    the checkout whose ``conf/`` ran, from Hydra's ``main`` config source, and the folder it ran
    from, ``hydra.runtime.cwd``) and by ``paths`` (``data_dir``, ``output_root``). Relative paths
    and unresolved interpolations are left out: they name no machine."""
    runtime = ((hydra_config.get("hydra") or {}).get("runtime") or {})
    conf = next((s.get("path") for s in runtime.get("config_sources") or [] if s.get("provider") == "main"), None)
    found = {"repo": os.path.dirname(os.path.normpath(conf)) if isinstance(conf, str) else None,
             "cwd": runtime.get("cwd"), "data_dir": paths.get("data_dir"), "output_root": paths.get("output_root")}
    return {TOKENS[k]: os.path.normpath(v) for k, v in found.items() if isinstance(v, str) and os.path.isabs(v)}


def machine_roots(job_dir: Path) -> dict[str, str]:
    """``config_roots`` of a job: its ``.hydra/hydra.yaml`` and resolved ``paths``."""
    return config_roots(_yaml(job_dir / ".hydra" / "hydra.yaml"),
                        _yaml(job_dir / "config_resolved.yaml").get("paths") or {})


def multirun_roots(sweep_dir: Path, jobs: list[Path]) -> list[tuple[str, str]]:
    """(token, path) pairs of every machine path the files of a multirun folder can name: its own
    ``multirun.yaml`` (the last launch's machine, which may hold only restored records) and each of
    its ``jobs`` (which may have run on different machines)."""
    multirun = _yaml(sweep_dir / "multirun.yaml")
    found = [config_roots(multirun, multirun.get("paths") or {}), *(machine_roots(job) for job in jobs)]
    return sorted({item for roots in found for item in roots.items()})


def scrub(text: str, roots: Iterable[tuple[str, str]]) -> str:
    """``text`` with each root path of the (token, path) pairs replaced by its token (longest first,
    so a root under another keeps its own token; one path under two tokens, e.g. a run from its
    checkout, takes the first of ``TOKENS``: ``<repo>``)."""
    order = list(TOKENS.values())
    for token, root in sorted(roots, key=lambda item: (-len(item[1]), order.index(item[0]))):
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
    by_sweep: dict[Path, list[Path]] = {}
    for job in jobs:
        by_sweep.setdefault(job.parent, []).append(job)
    for sweep_dir, sweep_jobs in by_sweep.items():
        roots = multirun_roots(sweep_dir, sweep_jobs)
        files = [job / rel for job in sweep_jobs for rel in record_files(job)]
        files += [sweep_dir / name for name in SWEEP_FILES if (sweep_dir / name).is_file()]
        for src in files:
            text = scrub(src.read_text(), roots)
            left = sorted({root for _, root in roots if root in text})
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
