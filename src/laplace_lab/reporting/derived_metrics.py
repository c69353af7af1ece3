"""Metrics a table computes from a job's logged ones: ``mean(<pattern>)``.

``mean(shift/rot_*/la/ece)`` is, per job, the mean of every metric whose key matches the
``fnmatch`` pattern (here the ECE at each rotation angle of rotated MNIST: the summary over a
shift curve that the papers report). A table names it like any logged metric (``aggregate.metrics``,
``--metrics``, ``reference.yaml``), and it is computed at aggregation time, so jobs that logged the
curve need not rerun. A job's value is non-finite when any matched value is. Every job that
matches must match the same keys, or the means would not be comparable, and a pattern no job
matches is an error.
"""

from __future__ import annotations

import fnmatch
import math
import re

DERIVED = re.compile(r"^mean\((?P<pattern>[^()]+)\)$")


def matched_keys(name: str, metrics: dict[str, float]) -> tuple[str, ...] | None:
    """The keys of ``metrics`` that derived metric ``name`` averages (sorted); None when ``name``
    is not of the form ``mean(<pattern>)``."""
    match = DERIVED.match(name)
    if match is None:
        return None
    return tuple(sorted(k for k in metrics if fnmatch.fnmatchcase(k, match["pattern"])))


def add_derived(names: list[str], jobs: list[dict[str, float]], labels: list[str]) -> None:
    """Add each ``mean(<pattern>)`` of ``names`` to every job's metrics dict that matches it (in
    place; ``labels[i]`` names job i in errors). Raises ``ValueError`` when the jobs match
    different key sets, or when no job matches a pattern."""
    for name in names:
        per_job = [matched_keys(name, m) for m in jobs]
        if per_job and per_job[0] is None:
            continue
        key_sets = {keys for keys in per_job if keys}
        if not key_sets:
            raise ValueError(f"metric {name!r}: its pattern matches no metric of any job")
        if len(key_sets) > 1:
            first, other = sorted(key_sets, key=len)[:2]
            where = [labels[i] for i, keys in enumerate(per_job) if keys == first][:1]
            raise ValueError(f"metric {name!r} averages different keys in different jobs "
                             f"({len(first)} in {where[0]}, {len(other)} elsewhere; e.g. "
                             f"{sorted(set(other) ^ set(first))[:3]}): the means are not comparable")
        for metrics, keys in zip(jobs, per_job):
            if keys:
                values = [metrics[k] for k in keys]
                metrics[name] = (math.fsum(values) / len(values)
                                 if all(math.isfinite(v) for v in values) else math.nan)
