"""The run's configuration: where the Hydra config files live (``CONF_DIR``), the per-value checks
(``values``: finite, in range, typed, known keys, allowed ``_target_``) and the checks of option
combinations (``validation``), all run before any data is loaded."""

from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
