"""Our side of a peer CSV (``laplace_lab.reporting.peer_pairs``) read from a committed jobs CSV
(``results/<table>.jobs.csv``): one ``side=ours`` row per job, with the job's commit, its command
(``python -m laplace_lab.train`` + its overrides), its seed (an override such as ``data.split``)
and the settings and metrics asked for, renamed to the peer CSV's columns.

    rows = ours_rows("results/heteroscedastic_uci.jobs.csv", seed_key="data.split",
                     settings={"data": "data.name", "method": "method_name"},
                     metrics={"test/la_het_mean/ll": "test/la/ll"})
"""

from __future__ import annotations

import csv
import shlex
from pathlib import Path


def _overrides(text: str) -> dict[str, str]:
    """``"data.name=yacht data.split=0 method=het_online"`` -> ``{key: value}``."""
    out = {}
    for token in shlex.split(text):
        key, sep, value = token.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def read_jobs(path: str | Path) -> list[dict[str, str]]:
    """The rows of a jobs CSV (its ``#`` provenance lines skipped)."""
    with Path(path).open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def ours_rows(jobs_csv: str | Path, seed_key: str, settings: dict[str, str],
              metrics: dict[str, str], where: dict[str, str] | None = None) -> list[dict[str, str]]:
    """``side=ours`` peer rows of the jobs in ``jobs_csv``.

    ``seed_key``: the override (or column) whose value is the row's ``seed`` (the split of a UCI
    job, ``seed`` of an image job; a job without it has seed 0, Hydra's default); ``settings``:
    peer column -> jobs column or override; ``metrics``: peer column -> jobs CSV metric column;
    ``where``: keep only jobs whose column/override equals the value. A job of a dirty checkout
    raises: a peer row must come from one clean commit."""
    out = []
    for job in read_jobs(jobs_csv):
        over = _overrides(job.get("overrides", ""))

        def value(key: str, job=job, over=over) -> str:
            return job[key] if key in job and job[key] != "" else over.get(key, "")

        if any(value(k) != v for k, v in (where or {}).items()):
            continue
        if job.get("dirty", "False") not in ("False", "false", "0", ""):
            raise ValueError(f"{jobs_csv}: job {job.get('job')!r} ran from a dirty checkout; peer rows need a clean commit")
        row = {"side": "ours", "seed": value(seed_key) or "0", "commit": job["commit"],
               "command": "python -m laplace_lab.train " + job.get("overrides", "")}
        for column, key in settings.items():
            row[column] = value(key)
        for column, key in metrics.items():
            if key not in job:
                raise ValueError(f"{jobs_csv}: no metric column {key!r}; columns: {list(job)}")
            row[column] = job[key]
        out.append(row)
    return out
