"""Names are names: an option or argument that becomes part of a path is checked before it is used.

- ``check_name(value, option)``: a plain name (``PLAIN_NAME``: letters, digits, ``_ . - + = ,``;
  no ``/``, no leading dot, no ``..``), e.g. a table name (``--name``, ``aggregate.name``) or
  ``experiment_name``: ``--name $PWD/results/redux_mnist`` or ``../README`` would replace a file
  outside the folder the name is meant for.
- ``check_root(value, option)``: a folder that roots what a run writes (``paths.output_root``,
  ``map_cache.dir``): not empty (``''`` meant the working directory or, joined to ``/default``,
  the filesystem root) and not the filesystem root itself.
- ``inside(path, root, option)``: ``root / path`` for a relative ``path`` that stays under ``root``
  (``aggregate.results_dir`` under the sweep folder); an absolute path or one that leaves ``root``
  is an error.

Each raises ``ValueError`` naming the option, what it got and what is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=,\-]{0,199}")


def check_name(value: Any, option: str) -> str:
    """``value`` if it is a plain name (``PLAIN_NAME``, no ``..``), else ``ValueError``."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value) or ".." in value:
        raise ValueError(f"{option}={value!r} is not a plain name: it becomes part of a file or folder name; allowed: "
                         "letters, digits and _ . - + = , (no /, no leading dot, no ..), e.g. 'redux_mnist'")
    return value


def check_root(value: Any, option: str) -> str:
    """``value`` if it names a folder other than the filesystem root, else ``ValueError``."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{option}={value!r} is empty: it is the folder everything below it is written into; "
                         "allowed: a folder, relative to the working directory or absolute (e.g. 'outputs')")
    if Path(value).expanduser().resolve() == Path(Path(value).resolve().anchor):
        raise ValueError(f"{option}={value!r} is the filesystem root; allowed: a folder below it (e.g. 'outputs')")
    return value


def inside(path: str | Path, root: str | Path, option: str) -> Path:
    """``root / path`` for a relative ``path`` that stays under ``root``, else ``ValueError``."""
    given = Path(path)
    target = Path(root) / given
    if given.is_absolute() or not target.resolve().is_relative_to(Path(root).resolve()):
        raise ValueError(f"{option}={str(path)!r} leaves its folder {root}: allowed: a relative folder below it "
                         "(e.g. 'results'), no absolute path and no ..")
    return target
