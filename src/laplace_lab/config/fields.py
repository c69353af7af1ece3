"""The typed config fields (``option``, ``group``, ``build``, ...) live in ``io.fields``, below every
layer that declares options (the config groups here, the data modules' ``Options`` in ``data``)."""

from laplace_lab.io.fields import (
    INF,
    REQUIRED,
    Spec,
    build,
    check,
    defaults,
    group,
    option,
    type_name,
)

__all__ = ["INF", "REQUIRED", "Spec", "build", "check", "defaults", "group", "option", "type_name"]
