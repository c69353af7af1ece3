"""Job records: carry a sweep's finished jobs across machines that do not keep ``outputs/``.

    python -m laplace_lab.sweeps.records save outputs/images250 results/sweeps
    python -m laplace_lab.sweeps.records restore results/sweeps outputs/images250

``save`` copies every *finished* job (``status.is_finished``) under the source folder, keeping its
path relative to that folder, with the text files that ``laplace_lab.reporting.tables`` and an audit need
(``RECORD_SUFFIXES``: ``status.json``, ``metrics.json``, the Hydra and resolved configs, the CSV
training curve) and its multirun folder's ``launches.jsonl`` / ``multirun.yaml`` / ``summary.json``.
Checkpoints, logs and figures stay behind. The machine's absolute paths in those files (the
checkout whose ``conf/`` the job ran, the folder it ran from, its data and output roots, and,
where they lie elsewhere, ``map_cache.dir``, ``checkpoint.dirpath``, ``checkpoint.resume_from`` and
the sweep folder) are replaced by ``<repo>``, ``<cwd>``, ``<data_dir>``, ``<output_root>``,
``<map_cache_dir>``, ``<checkpoint_dir>``, ``<resume_from>`` and ``<sweep_dir>``, and the ``host`` fields
of the JSON files by ``<host>``, so a record names no path or host of the machine that ran it (an
absolute path left after that stops ``save``, naming the file); the paths are run-only keys, so
neither the job's folder name nor its ``config_hash`` depends on them.

``restore`` copies records back under an output root, never over an existing file, and only what
``save`` writes: files with the record suffixes outside ``checkpoints/``, ``wandb/`` and
``figures/`` (anything else is listed as left out). A symbolic link, a file over
``MAX_RECORD_BYTES`` (16 MiB) or a destination outside the output root (through a link there)
stops it before anything is copied. Relaunching the sweep's commands with that output root then
skips the restored jobs (finished, same config hash) and runs the rest; ``tables`` reads restored
and new jobs alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from laplace_lab.io.atomic import write_text_atomic
from laplace_lab.sweeps.status import LAUNCH_LOG, STATUS_FILE, SUMMARY_FILE, is_finished
from laplace_lab.sweeps.superseded import SUPERSEDED_DIR

log = logging.getLogger(__name__)

RECORD_SUFFIXES = (".json", ".jsonl", ".yaml", ".csv")
SKIP_DIRS = ("checkpoints", "wandb", "figures", SUPERSEDED_DIR)
SWEEP_FILES = (LAUNCH_LOG, "multirun.yaml", SUMMARY_FILE)
TOKENS = {"repo": "<repo>", "cwd": "<cwd>", "data_dir": "<data_dir>", "output_root": "<output_root>",
          "sweep_dir": "<sweep_dir>", "map_cache_dir": "<map_cache_dir>", "checkpoint_dir": "<checkpoint_dir>",
          "resume_from": "<resume_from>"}
# config options that may hold a machine path outside the roots above (token: dotted option)
PATH_OPTIONS = {"map_cache_dir": "map_cache.dir", "checkpoint_dir": "checkpoint.dirpath",
                "resume_from": "checkpoint.resume_from"}
HOST_TOKEN = "<host>"
HOST_FIELD = re.compile(r'("host"\s*:\s*)"(?:[^"\\]|\\.)*"')
# an absolute path: "/" not inside a word, a relative path, a URL, a token or an interpolation
ABSOLUTE_PATH = re.compile(r"(?<![\w.<>/:~}-])/(?:[\w.+@%=,-]+/)*[\w.+@%=,-]+")
MAX_RECORD_BYTES = 16 * 2**20


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


def _select(config: dict, key: str):
    node = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _outside(value, roots: dict[str, str]) -> str | None:
    """``value`` normalised if it is an absolute path outside every root, else None."""
    if not (isinstance(value, str) and os.path.isabs(value)):
        return None
    value = os.path.normpath(value)
    inside = any(value == r or value.startswith(r.rstrip("/") + "/") for r in roots.values())
    return None if inside else value


def option_roots(config: dict, roots: dict[str, str]) -> dict[str, str]:
    """{token: absolute path} of the ``PATH_OPTIONS`` of a resolved config that lie outside ``roots``
    (a path under a root keeps that root's token)."""
    found = {}
    for name, key in PATH_OPTIONS.items():
        value = _outside(_select(config, key), roots)
        if value is not None:
            found[TOKENS[name]] = value
    return found


def machine_roots(job_dir: Path) -> dict[str, str]:
    """``config_roots`` of a job (its ``.hydra/hydra.yaml`` and resolved ``paths``), its sweep folder
    and the ``PATH_OPTIONS`` of its resolved config that lie elsewhere."""
    hydra_config, config = _yaml(job_dir / ".hydra" / "hydra.yaml"), _yaml(job_dir / "config_resolved.yaml")
    roots = config_roots(hydra_config, config.get("paths") or {})
    sweep = _outside(_select(hydra_config, "hydra.sweep.dir"), roots)
    if sweep is not None:
        roots[TOKENS["sweep_dir"]] = sweep
    return {**roots, **option_roots(config, roots)}


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
    checkout, takes the first of ``TOKENS``: ``<repo>``), and every JSON ``"host"`` field's value by
    ``<host>``."""
    order = list(TOKENS.values())
    for token, root in sorted(roots, key=lambda item: (-len(item[1]), order.index(item[0]))):
        text = text.replace(root, token)
    return HOST_FIELD.sub(rf'\1"{HOST_TOKEN}"', text)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths left in ``text`` (what ``save`` refuses to write)."""
    return sorted(set(ABSOLUTE_PATH.findall(text)))


def record_files(job_dir: Path) -> list[Path]:
    """The job's files that go into its record (relative to ``job_dir``): regular files (no links)
    with a record suffix, outside ``SKIP_DIRS``."""
    out = []
    for path in sorted(job_dir.rglob("*")):
        rel = path.relative_to(job_dir)
        if path.is_file() and not path.is_symlink() and is_record_file(rel):
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
        files += [sweep_dir / name for name in SWEEP_FILES
                  if (sweep_dir / name).is_file() and not (sweep_dir / name).is_symlink()]
        for src in files:
            if src.stat().st_size > MAX_RECORD_BYTES:
                raise ValueError(f"{src}: {src.stat().st_size} bytes, over the {MAX_RECORD_BYTES} bytes a record "
                                 "file may have")
            text = scrub(src.read_text(), roots)
            left = sorted({root for _, root in roots if root in text} | set(absolute_paths(text)))
            if left:
                raise ValueError(f"{src}: machine path(s) {left} left after scrubbing; a record must name no "
                                 f"path of the machine (tokens: {list(TOKENS.values())})")
            dst = dest / src.relative_to(source)
            dst.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(dst, text)
    return jobs


def is_record_file(rel: Path) -> bool:
    """Whether a file (relative to a records folder) is of a kind ``save`` writes."""
    return rel.suffix in RECORD_SUFFIXES and not set(rel.parts[:-1]) & set(SKIP_DIRS)


def restore_plan(records: Path, dest: Path) -> tuple[list[Path], list[Path]]:
    """(record files to copy, other files left out), relative to ``records``; ``ValueError`` naming
    every symbolic link, file over ``MAX_RECORD_BYTES`` and destination outside ``dest``."""
    problems, files, other = [], [], []
    dest_root = dest.resolve()
    for folder, dirs, names in os.walk(records, followlinks=False):
        for name in sorted([*dirs, *names]):
            path = Path(folder) / name
            rel = path.relative_to(records)
            if path.is_symlink():
                problems.append(f"{rel}: a symbolic link (to {os.readlink(path)})")
            elif name in names and not path.is_file():
                problems.append(f"{rel}: not a regular file")
            elif name in names and is_record_file(rel):
                size = path.lstat().st_size
                target = (dest / rel).parent.resolve() / rel.name
                if size > MAX_RECORD_BYTES:
                    problems.append(f"{rel}: {size} bytes, over the {MAX_RECORD_BYTES} bytes a record file may have")
                elif not target.is_relative_to(dest_root) or (dest / rel).is_symlink():
                    problems.append(f"{rel}: its destination {target} lies outside {dest} (a link there)")
                else:
                    files.append(rel)
            elif name in names:
                other.append(rel)
    if problems:
        raise ValueError(f"refusing to restore {records}: " + "; ".join(problems)
                         + ". Records hold only the regular text files `records save` writes.")
    return sorted(files), sorted(other)


def _copy_record(src: Path, dst: Path) -> None:
    """Copy without following links at either end (the source opened with O_NOFOLLOW, the
    destination created exclusively) and no more than ``MAX_RECORD_BYTES``."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"{src}: over {MAX_RECORD_BYTES} bytes")
    with open(dst, "xb") as f:
        f.write(data)


def restore(records: Path, dest: Path) -> tuple[int, int]:
    """Copy the record files under ``records`` into ``dest``, never over an existing file (see the
    module docstring for what is refused and what is left out). Returns (files copied, files left
    because ``dest`` already had them)."""
    records, dest = Path(records), Path(dest)
    if not records.is_dir():
        raise FileNotFoundError(f"records folder {records} does not exist")
    files, other = restore_plan(records, dest)
    if other:
        log.warning("%d file(s) of %s are not records and were left out: %s", len(other), records,
                    ", ".join(map(str, other[:10])) + (" ..." if len(other) > 10 else ""))
    copied = kept = 0
    for rel in files:
        dst = dest / rel
        if dst.exists() or dst.is_symlink():
            kept += 1
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        _copy_record(records / rel, dst)
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
