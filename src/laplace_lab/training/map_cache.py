"""Cache of trained MAP networks, so runs that differ only in their post-hoc Laplace reuse one
training (e.g. the methods of a paper table that share the MAP network of a seed).

The key hashes three things:

- the whole resolved config less a deny-list: the run-only keys shared with the sweep's config
  hash (``laplace_lab.sweeps.run_only``) and the keys that only shape what happens after training
  (``POSTHOC_ONLY_KEYS``: curvature, predictive, evaluation, post-hoc marglik, ``ensemble`` (a
  member is trained exactly as a single run with its seed, so the two share a cache entry), ``prior.structure``,
  which only shapes the Laplace's prior: training starts every tensor at ``prior.prior_precision``,
  and ``data.test_holdout``, which only cuts the test set).
  A new config key therefore invalidates the cache unless it is added to a deny-list;
- the data files the data module read (path relative to the data module's ``root``, size and a
  SHA-256 of the contents; ``data_files()`` of the data module, none for generated data), so a data
  folder copied or moved to another place or machine keeps its cache entries;
- the code: the package version, torch's version and a hash of this package's Python sources.

Runs with online marglik (which changes training) are never cached. An unreadable cache entry
(cut off, garbage, not a state dict) is named in a warning and retrained; an unwritable cache folder
gives a warning and no cache, never a failed run. Entries are written atomically under unique
temporary names (``io.atomic``), so concurrent writers and readers never see a torn file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
from pathlib import Path
from typing import Any

import torch

from laplace_lab.config.schema import RunConfig
from laplace_lab.io.atomic import atomic_path, write_text_atomic
from laplace_lab.sweeps.run_only import RUN_ONLY_KEYS, RUN_ONLY_SUBKEYS, strip_run_only
from laplace_lab.training.module import MAPCore

log = logging.getLogger(__name__)
PACKAGE_DIR = Path(__file__).resolve().parents[1]
POSTHOC_ONLY_KEYS = ("curvature", "predictive", "evaluation", "marglik", "method_name", "checkpoint", "ensemble")
POSTHOC_ONLY_SUBKEYS = {"prior": ("structure",), "data": ("test_holdout",)}
DENY_KEYS = RUN_ONLY_KEYS + POSTHOC_ONLY_KEYS
# group -> every key the key leaves out of it (run-only and post-hoc-only keys of one group add up)
DENY_SUBKEYS = {group: RUN_ONLY_SUBKEYS.get(group, ()) + POSTHOC_ONLY_SUBKEYS.get(group, ())
                for group in {**RUN_ONLY_SUBKEYS, **POSTHOC_ONLY_SUBKEYS}}


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> dict[str, str]:
    """Package and torch versions, and a hash of every ``.py`` file of ``laplace_lab``."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE_DIR)).encode())
        digest.update(path.read_bytes())
    try:
        version = importlib.metadata.version("laplace-lab")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"laplace_lab": version, "torch": torch.__version__, "sources": digest.hexdigest()[:16]}


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """SHA-256 (16 hex digits) of a file's bytes; cached per (path, size, mtime) within a process
    (about 0.1 s for MNIST's 55 MB, once per sweep process)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def data_fingerprint(datamodule: Any) -> list[list]:
    """``[relative path, size, sha256]`` of every file the data module read (``data_files()``);
    paths relative to ``datamodule.root`` where they are under it."""
    files = datamodule.data_files() if hasattr(datamodule, "data_files") else []
    root = getattr(datamodule, "root", None)
    out = []
    for path in sorted(Path(f) for f in files):
        stat = path.stat()
        name = path.relative_to(root) if root is not None and path.is_relative_to(root) else path.name
        out.append([str(name), stat.st_size, _file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)])
    return out


def key_contents(run: RunConfig, datamodule: Any = None) -> dict[str, Any]:
    """What the cache key hashes (also written beside the cached network as ``<key>.json``)."""
    config = strip_run_only(run.raw, DENY_KEYS, DENY_SUBKEYS)
    return {"config": config, "data_files": data_fingerprint(datamodule) if datamodule is not None else [],
            "code": code_fingerprint()}


def cache_key(run: RunConfig, datamodule: Any = None) -> str:
    """Stable hash of ``key_contents``."""
    contents = json.dumps(key_contents(run, datamodule), sort_keys=True, default=str)
    return hashlib.sha256(contents.encode()).hexdigest()[:16]


def cache_path(run: RunConfig, datamodule: Any = None) -> Path | None:
    """Where this config's MAP network is cached, or ``None`` if caching does not apply (online marglik
    changes training)."""
    if not run.map_cache.enabled or run.marglik.online:
        return None
    return Path(run.map_cache.dir) / f"{cache_key(run, datamodule)}.pt"


def load(module: MAPCore, path: Path | None) -> bool:
    """Load the cached weights and hyperparameter buffers into ``module``; ``False`` if absent
    (or unreadable: then with a warning, and the network is trained again)."""
    if path is None or not path.exists():
        return False
    try:
        module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as err:  # noqa: BLE001 - cut off, garbage, not a state dict: named, then trained again
        log.warning("MAP cache entry %s is unreadable (%s: %s): training again (the entry is rewritten after "
                    "training)", path, type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return False
    log.info("loaded the cached MAP network %s (training skipped)", path)
    return True


def save(module: MAPCore, path: Path | None, contents: dict[str, Any] | None = None) -> bool:
    """Write the network to ``path`` (and ``contents`` to ``<key>.json``); a folder that cannot be
    written gives a warning and ``False`` (no cache), never an error that would lose the run."""
    if path is None:
        return False
    try:  # write-then-rename with a temporary name of this process and call: writers never share one
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            torch.save(module.state_dict(), tmp)
        if contents is not None:
            write_text_atomic(path.with_suffix(".json"), json.dumps(contents, indent=2, sort_keys=True, default=str))
    except OSError as err:
        log.warning("MAP cache: cannot write %s (%s: %s); this run's network is not cached (map_cache.dir)",
                    path, type(err).__name__, err)
        return False
    return True
