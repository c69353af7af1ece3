"""Atomic file writes: a reader in another process sees the old file or the new one, never a torn
one (a ``metrics.json`` half written when a job is killed, two writers of one temporary file).

Every write goes to a temporary file with a unique name in the same folder
(``.<name>.<pid>.<random>.tmp``), is flushed to disk and then renamed over the target
(``os.replace``, atomic on POSIX file systems). A failed write removes its temporary file.

- ``atomic_path(path)``: a context manager yielding the temporary path to write (any writer:
  ``torch.save``, ``matplotlib``); renamed over ``path`` when the block ends without an error.
- ``write_text_atomic``, ``write_bytes_atomic``, ``write_json_atomic``: the common cases.
- ``write_texts_together(contents, journal)``: several files of one folder that become visible
  together (a table's ``.md`` / ``.csv`` / ``.jobs.csv``). Each is written whole to its temporary
  file first; then the ``journal`` (which temporary file becomes which file) is written atomically:
  the commit point. The renames follow and the journal is removed. A crash before the journal
  leaves the old files (and no temporary file); a crash between two renames leaves the journal,
  and ``finish_interrupted(journal)``, which every reader and the next write call first, completes
  the renames: a reader never sees a new ``.md`` beside an old ``.csv``.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def temp_name(path: Path) -> Path:
    """A temporary path beside ``path``, unique per process and call."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path`` (made durable first)."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | Path, data: Any, indent: int | None = 2) -> None:
    """``data`` as JSON (``default=str`` for paths, numpy scalars, ...)."""
    write_text_atomic(path, json.dumps(data, indent=indent, default=str))


def finish_interrupted(journal: str | Path) -> bool:
    """Complete the renames of a ``write_texts_together`` that stopped after its commit point
    (``journal`` exists); True when it did. Idempotent: a temporary file already renamed is skipped."""
    journal = Path(journal)
    if not journal.is_file():
        return False
    for target, tmp in json.loads(journal.read_text()).items():
        if (journal.parent / tmp).is_file():
            os.replace(journal.parent / tmp, journal.parent / target)
    journal.unlink()
    return True


def write_texts_together(contents: dict[Path, str], journal: str | Path) -> None:
    """Write every ``path: text`` of ``contents`` (all in ``journal``'s folder) so that they become
    visible together (see the module docstring)."""
    journal = Path(journal)
    if any(Path(path).parent != journal.parent for path in contents):
        raise ValueError(f"write_texts_together: every file must be in the journal's folder {journal.parent}")
    finish_interrupted(journal)
    temps: dict[Path, Path] = {}
    try:
        for path, text in contents.items():
            temps[Path(path)] = tmp = temp_name(Path(path))
            tmp.write_text(text)
            _fsync(tmp)
        write_json_atomic(journal, {path.name: tmp.name for path, tmp in temps.items()})  # the commit point
    except BaseException:
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    finish_interrupted(journal)
