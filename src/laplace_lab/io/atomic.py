"""Atomic file writes: a reader in another process sees the old file or the new one, never a torn
one (a ``metrics.json`` half written when a job is killed, two writers of one temporary file).

Every write goes to a temporary file with a unique name in the same folder
(``.<name>.<pid>.<random>.tmp``), is flushed to disk and then renamed over the target
(``os.replace``, atomic on POSIX file systems). A failed write removes its temporary file.

- ``atomic_path(path)``: a context manager yielding the temporary path to write (any writer:
  ``torch.save``, ``matplotlib``); renamed over ``path`` when the block ends without an error.
- ``write_text_atomic``, ``write_bytes_atomic``, ``write_json_atomic``: the common cases.
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
