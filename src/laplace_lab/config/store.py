"""The schema's defaults as Hydra config nodes, so the option files keep only what differs, and the
job config's resolver ``lab_if_equal``.

``register()`` stores, in Hydra's ``ConfigStore``, ``schema/<group>`` (or ``schema/<group>/<option>``
where the options carry different keys, ``schema.GROUPS``) from the dataclasses of ``config.schema``,
``schema/root`` (the root keys) and ``schema/structure/<name>`` (a Hessian structure's own options
with their defaults, from its class's ``Options``). ``conf/<group>/<option>.yaml`` lists its node
first::

    defaults:
      - /schema/marglik/online@_here_
      - _self_

(``conf/curvature/kron.yaml`` lists ``/schema/structure/kron@_here_`` after ``/schema/curvature@_here_``).

Nodes are plain values (not structured configs): types, ranges and unknown keys are checked by
``config.load`` with messages that name the option and the allowed values. Importing
``laplace_lab.config`` registers them (the entry point and the tests' composition import it).
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from laplace_lab.config.fields import defaults
from laplace_lab.config.schema import GROUPS, RootOptions
from laplace_lab.laplace.spec import hessian_structures, structure_class


def nodes() -> dict[str, dict]:
    """``{"<group>[/<option>]": node}`` of every schema node, ``"root"`` and ``"structure/<name>"``."""
    out = {"root": defaults(RootOptions)}
    out |= {f"structure/{name}": structure_class(name).option_defaults() for name in hessian_structures()}
    for name, (cls, options) in GROUPS.items():
        if options is None:
            out[name] = defaults(cls)
        else:
            out |= {f"{name}/{option}": defaults(cls, option) for option in options}
    return out


def if_equal(value, expected, then, otherwise):
    """``then`` if ``value == expected`` else ``otherwise``, e.g. in a preset
    ``val_fraction: ${lab_if_equal:${method_name},map_grid,0.1,0.0}`` (a validation split only
    for the method that needs one). A list or dict result comes back as an OmegaConf container, so
    the config still resolves in place."""
    result = then if value == expected else otherwise
    return OmegaConf.create(result) if isinstance(result, (list, dict)) else result


def register() -> None:
    store = ConfigStore.instance()
    for path, node in nodes().items():
        group, _, name = f"schema/{path}".rpartition("/")
        store.store(group=group, name=name, node=node)
    if not OmegaConf.has_resolver("lab_if_equal"):
        OmegaConf.register_new_resolver("lab_if_equal", if_equal)
