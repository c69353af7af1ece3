"""The run's configuration, the boundary between Hydra and the rest of the package.

- ``schema``: one dataclass per config group (types, defaults, allowed values) and ``RunConfig``;
  the ``evaluation`` group's is ``evaluation.options.EvalConfig``; ``fields``: ``io.fields`` (how an
  option is declared and checked);
- ``store``: their defaults as Hydra nodes (``schema/<group>``) that the option files start from,
  and the job config's resolver ``lab_if_equal`` (registered when this package is imported);
- ``load``: ``load_run_config`` reads a composed config into the typed ``RunConfig``;
  ``values``: the whole-config checks and the constructor-typed groups; ``validation``: the
  combinations; ``instantiate``: objects by ``_target_``, our errors unwrapped.

``CONF_DIR`` is where the Hydra config files live; the paper presets live in their folders,
``experiments/<preset>/`` (``presets``: the config source that serves them as ``experiment=<preset>``).
"""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def _register_schema() -> None:
    try:
        import hydra.core.config_store  # noqa: F401
    except ImportError:  # the engine and the training module without Hydra (benchmarks/gpu.py on a bare
        return           # machine): nothing composes a config there, so there is nothing to register
    from laplace_lab.config import presets
    from laplace_lab.config.store import register

    register()
    presets.register()


_register_schema()  # the schema/* nodes the option files start from (config.store); the preset folders' source
