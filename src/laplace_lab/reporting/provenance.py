"""Where a table's jobs come from: one clean commit containing the preset, one launch command,
and header text without machine paths. Used by ``laplace_lab.reporting.tables``.

A job's ``status.json`` carries ``git`` (``sweeps.status.git_state`` at job start: commit, dirty,
dirty_files, ignored_checked) and ``launch_id`` (the launch that ran the job: a line of
``<sweep dir>/launches.jsonl``). More than ``HEADER_LIST_MAX`` launch commands are summarised by
the overrides they share and the keys that vary, not listed.
"""

from __future__ import annotations

import shlex
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laplace_lab.config.presets import PRESET_FILE
from laplace_lab.sweeps import run_only
from laplace_lab.sweeps.status import ENTRY, REPO_ROOT, read_launches

UNRECORDED = "(not recorded)"
OUTSIDE = "<outside the repository>"
HEADER_LIST_MAX = 4  # a table header lists at most this many launch commands or sweep folders; more are summarised


def count_jobs(n: int) -> str:
    """``"1 job"`` / ``"<n> jobs"``."""
    return f"{n} job" if n == 1 else f"{n} jobs"


def commit_has_file(commit: str, path: str, repo_root: str | Path | None = None) -> bool:
    """True when ``commit`` (of the repository at ``repo_root``, default ``REPO_ROOT``) contains ``path``."""
    try:
        out = subprocess.run(["git", "-C", str(repo_root or REPO_ROOT), "cat-file", "-e", f"{commit}:{path}"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def preset_files(preset: str) -> tuple[str, str]:
    """Where a commit holds preset ``preset``: its folder's ``preset.yaml``, or the one file
    ``conf/experiment/<preset>.yaml`` of the commits before presets became folders."""
    return f"experiments/{preset}/{PRESET_FILE}", f"conf/experiment/{preset}.yaml"


def run_commit(run: Any) -> str:
    """The commit a run recorded, or ``UNRECORDED``."""
    return (run.status.get("git") or {}).get("commit") or UNRECORDED


def commit_problems(runs: list, preset: str | None, repo_root: str | Path | None = None,
                    label: Callable[[Path], str] = str) -> list[str]:
    """Why ``runs`` do not come from one clean commit containing the preset: ``experiments/<preset>/preset.yaml``
    (or, for jobs of a commit before presets became folders, ``conf/experiment/<preset>.yaml``);
    ``label`` shows a job folder."""
    problems = []
    commits = Counter(run_commit(r) for r in runs)
    if len(commits) > 1:
        problems.append(f"the jobs come from {len(commits)} commits: "
                        + ", ".join(f"{c} ({count_jobs(n)})" for c, n in commits.most_common()))
    elif UNRECORDED in commits:
        problems.append("the jobs record no commit (no `git` in status.json)")
    gits = [(r, r.status.get("git") or {}) for r in runs if r.status.get("git")]
    dirty = [(r, g) for r, g in gits if g.get("dirty") is not False]
    if dirty:
        example = next((g.get("dirty_files") for _, g in dirty if g.get("dirty_files")), None)
        problems.append(f"{len(dirty)} job(s) ran from a dirty (or unknown) tree, e.g. {label(dirty[0][0].path)}"
                        + (f" ({'; '.join(example[:3])})" if example else ""))
    unchecked = [r for r, g in gits if g.get("dirty") is False and not g.get("ignored_checked")]
    if unchecked:
        problems.append(f"{len(unchecked)} job(s) recorded `dirty: false` without checking the ignored files of "
                        f"the package (recorded by an older version), e.g. {label(unchecked[0].path)}")
    if preset:
        paths = preset_files(preset)
        for commit in sorted(set(commits) - {UNRECORDED}):
            if not any(commit_has_file(commit, path, repo_root) for path in paths):
                problems.append(f"commit {commit} does not contain {paths[0]} (or is not in this repository)")
    return problems


def _key(token: str) -> str:
    return token.split("=", 1)[0].lstrip("+~")


LAUNCH_KEYS = ("experiment", "hydra/sweeper")  # run-only, yet they tell two launch commands apart


def is_run_only(key: str) -> bool:
    """True for override keys that do not change a run's result (``sweeps.run_only.is_run_only``:
    run-only keys, Hydra's groups such as the launcher), except the preset choice ``experiment`` and
    the sweeper choice ``hydra/sweeper`` (an Optuna and a grid search are two launches)."""
    key = _key(key)
    return run_only.is_run_only(key) and key.split(".", 1)[0] not in LAUNCH_KEYS and key not in LAUNCH_KEYS


def normalized_tokens(command: str) -> tuple[str, ...]:
    """A launch command's tokens less its entry point, ``-m`` and run-only overrides, sorted."""
    tokens = shlex.split(command)
    if " ".join(tokens[:3]) == ENTRY:
        tokens = tokens[3:]
    return tuple(sorted(t for t in tokens if t not in ("-m", "--multirun") and not is_run_only(_key(t))))


def run_launches(runs: list, sweep_dirs: list[Path]) -> dict[Path, dict[str, Any]]:
    """Each run's launch record (command, cwd, ...) from its sweep folder's ``launches.jsonl``."""
    launches = {launch["launch_id"]: launch for d in sweep_dirs for launch in read_launches(d)
                if isinstance(launch, dict) and "launch_id" in launch}
    return {r.path: launches[r.status["launch_id"]] for r in runs if r.status.get("launch_id") in launches}


def launch_problems(runs: list, launches: dict[Path, dict[str, Any]]) -> list[str]:
    """Why ``runs`` were not all launched by one command (run-only overrides do not count)."""
    if not launches:
        return []
    commands = Counter(normalized_tokens(launches[r.path]["command"]) if r.path in launches else None
                       for r in runs)  # None: no launch record
    if len(commands) < 2:
        return []
    if len(commands) <= HEADER_LIST_MAX:
        return [f"the jobs were launched by {len(commands)} different commands: " + "; ".join(
            f"[{UNRECORDED if c is None else ' '.join(c) or '(no overrides)'}] ({count_jobs(n)})"
            for c, n in commands.most_common())]
    unrecorded = commands.pop(None, 0)
    recorded = [set(c) for c in commands]  # four or more distinct commands
    shared = set.intersection(*recorded)
    varying = sorted({_key(t) for r in recorded for t in r - shared})
    sizes = sorted(set(commands.values()))
    each = f"{count_jobs(sizes[0])} each" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} jobs each"
    share = f"share [{' '.join(sorted(shared))}]" if shared else "share no override"
    return [f"the jobs were launched by {len(recorded)} different commands ({each}) that {share} and differ in "
            f"{', '.join(varying)}" + (f"; {count_jobs(unrecorded)} recorded no launch" if unrecorded else "")]


def portable_path(path: str | Path, bases: list[Path]) -> str:
    """``path`` relative to the first base that contains it; an outside absolute path loses its folders."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    for base in bases:
        try:
            return str(p.resolve().relative_to(base.resolve())) or "."
        except ValueError:
            continue
    return f"{OUTSIDE}/{p.name}"


def portable_command(command: str, bases: list[Path]) -> str:
    """``command`` with every absolute path (as a token or an override value) made portable."""
    out = []
    for token in shlex.split(command):
        key, eq, value = token.partition("=")
        if eq and value.startswith("/"):
            token = f"{key}={portable_path(value, bases)}"
        elif token.startswith("/"):
            token = portable_path(token, bases)
        out.append(shlex.quote(token))
    return " ".join(out)
