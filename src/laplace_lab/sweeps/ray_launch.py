"""Stop means stop under Ray: the Ray launcher's driver waits in a way a signal can stop.

``hydra_plugins.hydra_ray_launcher`` starts Ray in the launching process and then blocks in
``ray.get`` for each job. Two things made a SIGTERM / SIGINT to that process fail: ``ray.init``
replaces the process's signal handlers (a ``sys.exit`` handler, then the core worker's own C-level
handler, which logs "SIGTERM received" and aborts: exit status -6, no ``summary.json``, the lock
left to the dead process), and a Python handler that raises inside ``ray.get`` (which runs signal
checks from C++) leaves ``ray.get`` hanging. ``launch`` is the plugin's launch with both fixed:

- the signals are handled by ``signals.deferred()`` (recorded, not raised), re-installed right after
  Ray has started (a signal while it starts meets ``ray.init``'s ``sys.exit(signum)``, which is
  turned into ``JobInterrupted``);
- each job is waited for with ``ray.wait(timeout=POLL_S)`` in a loop; between waits
  ``signals.raise_pending()`` raises ``JobInterrupted`` from plain Python code, so the entry point
  stops the launch as for any other launcher: the signal goes to the processes below the driver
  (Ray's local node and its workers; each worker marks its job ``interrupted`` and exits 143), the
  summary is written, the lock released (``sweeps.callback``, ``sweeps.children``).
- A cluster the launch joined (``ray.init.address`` set) runs its workers outside this process's
  tree: there the waiting jobs are cancelled with ``ray.cancel`` (Ray interrupts the task, which the
  worker's SIGINT handler marks ``interrupted``) and waited for up to ``children.STOP_WAIT_S`` s.

The jobs, their configs and their results are the plugin's (its ``start_ray`` and
``launch_job_on_ray``); only the waiting differs. ``patch_ray_launcher()`` (called by
``laplace_lab.train`` at import) makes the plugin's ``RayLauncher.launch`` use it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from laplace_lab.sweeps import children, signals
from laplace_lab.sweeps.status import STATUS_FILE, read_status

log = logging.getLogger(__name__)
PLUGIN = "hydra_plugins.hydra_ray_launcher"
POLL_S = 0.5  # how often the driver looks for a signal while it waits for a job


def wait_for(refs: Sequence[Any], poll_s: float = POLL_S) -> list[Any]:
    """``[ray.get(ref) for ref in refs]`` (in order, the first failed job raises as there), each
    waited for in ``ray.wait`` steps of ``poll_s`` s with ``signals.raise_pending()`` between them."""
    import ray

    results = []
    for ref in refs:
        while True:
            signals.raise_pending()
            ready, _ = ray.wait([ref], num_returns=1, timeout=poll_s)
            if ready:
                break
        results.append(ray.get(ref))
    return results


def cancel(refs: Sequence[Any], wait_s: float = children.STOP_WAIT_S, poll_s: float = POLL_S) -> None:
    """Cancel the jobs of ``refs`` that have not ended (``ray.cancel``, not forced: the task is
    interrupted and marks its job) and wait up to ``wait_s`` s for them."""
    import ray

    _, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    if not waiting:
        return
    log.warning("Cancelling the %d job(s) still running on the Ray cluster and waiting up to %g s for them",
                len(waiting), wait_s)
    for ref in waiting:
        try:
            ray.cancel(ref, force=False)
        except Exception as err:  # noqa: BLE001 - the others are still cancelled; the summary says what ran
            log.error("Could not cancel a Ray job: %s: %s", type(err).__name__, err)
    deadline = time.monotonic() + wait_s
    while waiting and time.monotonic() < deadline:
        _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=poll_s)
    if waiting:
        log.error("%d Ray job(s) still running %g s after the cancel; their jobs stay unfinished", len(waiting), wait_s)


def job_processes(sweep_dir: Path) -> list[int]:
    """The pids of the processes below this one that run a job of ``sweep_dir`` (``pid`` of a
    ``running`` ``status.json``: Ray names its workers ``ray::<task>``, so their command line does not say)."""
    below = set(children.descendants())
    statuses = ((read_status(path.parent) or {}) for path in sweep_dir.rglob(STATUS_FILE))
    pids = {status.get("pid") for status in statuses if status.get("state") == "running"}
    return sorted(pid for pid in pids if pid in below)


def stop_workers(signum: int, sweep_dir: Path, wait_s: float = children.STOP_WAIT_S) -> list[int]:
    """Send ``signum`` to the worker processes of this launch's running jobs (``job_processes``) and
    wait up to ``wait_s`` s for them, before the rest of the local Ray node is stopped: a Ray node
    whose agent or raylet ends first kills its workers at once, before they have marked their jobs."""
    workers = job_processes(sweep_dir)
    if workers:
        log.warning("Forwarding %s to the %d Ray worker(s) running jobs (%s) and waiting up to %g s for them",
                    signal.Signals(signum).name, len(workers), ", ".join(map(str, workers)), wait_s)
        children.signal_and_wait(workers, signum, wait_s)
    return workers


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
    """The Ray plugin's ``_core.launch`` with the driver's waiting made stoppable (module docstring)."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, filter_overrides, setup_globals
    from hydra_plugins.hydra_ray_launcher._launcher_util import launch_job_on_ray, start_ray
    from omegaconf import open_dict

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info("Ray Launcher is launching %d jobs, sweep output dir: %s", len(job_overrides), sweep_dir)
    launcher.ray_cfg.init.setdefault("object_store_memory", 78643200)  # the plugin's default
    joined = launcher.ray_cfg.init.get("address") is not None
    refs: list[Any] = []
    with signals.deferred():
        try:
            start_ray(launcher.ray_cfg.init)
        except SystemExit as err:  # ray.init's own handler, while it starts: sys.exit(signum)
            if err.code in signals.HANDLED:
                raise signals.JobInterrupted(err.code) from None
            raise
        signals.reinstall()  # ray.init replaced the handlers
        try:
            signals.raise_pending()
            for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
                log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
                sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
                with open_dict(sweep_config):  # as the plugin: the scheduler's job id is set in the worker
                    sweep_config.hydra.job.id = f"job_id_for_{idx}"
                    sweep_config.hydra.job.num = idx
                refs.append(launch_job_on_ray(launcher.hydra_context, launcher.ray_cfg.remote, sweep_config,
                                              launcher.task_function, Singleton.get_state()))
                signals.raise_pending()
            return wait_for(refs)
        except signals.JobInterrupted as err:
            if joined and refs:
                cancel(refs)
            else:
                stop_workers(err.signum, sweep_dir)
            raise


CLASS = f"{PLUGIN}.ray_launcher.RayLauncher"


@functools.cache
def patch_ray_launcher() -> bool:
    """Make the Ray plugin's ``RayLauncher.launch`` use ``launch`` (once); False without the plugin.
    Hydra loads its plugins' modules a second time when it scans them, so the class it will build
    (``Plugins.instance().class_name_to_class``) is patched, and the one a plain import gives."""
    if importlib.util.find_spec(PLUGIN) is None:
        return False
    from hydra.core.plugins import Plugins
    from hydra_plugins.hydra_ray_launcher.ray_launcher import RayLauncher

    def stoppable_launch(self, job_overrides, initial_job_idx):
        return launch(self, job_overrides, initial_job_idx)

    stoppable_launch.__doc__ = launch.__doc__
    for cls in {RayLauncher, Plugins.instance().class_name_to_class.get(CLASS, RayLauncher)}:
        cls.launch = stoppable_launch
    return True
