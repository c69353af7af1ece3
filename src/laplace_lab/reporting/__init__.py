"""What a run and a sweep report, and the tables made from them.

- ``run_loggers``, ``csv_metrics``: a run's loggers (CSV always, wandb offline by default).
- ``tables`` (``python -m laplace_lab.reporting.tables``): a sweep's jobs aggregated into
  ``<name>.md`` / ``.csv`` / ``.jobs.csv``, with ``provenance`` (commit, launches, hardware),
  ``reference`` (verdicts against a paper's numbers), ``model_selection`` (ranking by the evidence),
  ``derived_metrics`` (``mean(<pattern>)``), ``summary_stats`` (mean and standard error) and
  ``figures`` (drawn from the jobs' curves); ``sweep_table``: the end-of-multirun table.
- ``wandb_workspace`` (``python -m laplace_lab.reporting.wandb_workspace``): a W&B workspace per sweep.
- ``peer_csv``: the resumable CSV of the laplace-torch peer scripts (``experiments/*/``).
"""
