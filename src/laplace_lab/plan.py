"""``python -m laplace_lab.plan [overrides]``: the memory and time plan of a run's Laplace, before
anything is trained.

Composes the run's config as ``laplace_lab.train`` does (the same overrides: ``model=... data=...
curvature=...``), builds its data and (untrained) network and prints one table row per
(structure, subset of weights) supporting the configured curvature type: the predicted peak memory
of the fit, what the posterior keeps, the glm predictive's memory per test input, the fit time
predicted from one probed batch (``laplace.plan.probe_fit_time``), and whether it fits
``laplace.plan.DEFAULT_MEMORY_BUDGET`` of this machine's available memory (``NO`` where it does not;
those are not timed). ``--no-time`` skips the probes.
"""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_dir

from laplace_lab.config import CONF_DIR
from laplace_lab.config.load import load_run_config
from laplace_lab.laplace import plan
from laplace_lab.training.build import build
from laplace_lab.training.laplace_plan import format_table, plan_table
from laplace_lab.training.loops import PLAIN


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    probe_time = "--no-time" not in args
    overrides = [a for a in args if a != "--no-time"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    run = load_run_config(cfg)
    datamodule, module = build(run, PLAIN)
    rows, batch, limit = plan_table(run, datamodule, module.model, module.likelihood, probe_time)
    c = run.curvature
    print(f"Laplace plan: {' '.join(overrides) or '(defaults)'}; likelihood {module.likelihood}, curvature "
          f"{c.type}, {datamodule.n_train} training rows in batches of {batch}; configured: "
          f"{c.hessian_structure}/{c.subset_of_weights}; budget {plan.human(limit)} "
          f"({plan.DEFAULT_MEMORY_BUDGET} of the available memory)")
    print(format_table(rows, limit))


if __name__ == "__main__":
    main()
