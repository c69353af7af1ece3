"""The schema's defaults as Hydra config nodes, so the option files keep only what differs, and the
job config's resolver ``lab_if_equal``.

``register()`` stores, in Hydra's ``ConfigStore``, ``schema/<group>`` (or ``schema/<group>/<option>``
where the options carry different keys, ``schema.GROUPS``) from the dataclasses of ``config.schema``,
``schema/root`` (the root keys), ``schema/structure/<name>`` (a Hessian structure's own options
with their defaults, from its class's ``Options``), and ``schema/data/<name>`` and
``schema/model/<name>`` (a data module's or a network's ``_target_`` and its options' defaults, from
its class's ``Options``; ``node_name`` gives ``<name>``). ``conf/<group>/<option>.yaml`` lists its node
first and states only what differs::

    defaults:
      - /schema/marglik/online@_here_
      - _self_

(``conf/curvature/kron.yaml`` lists ``/schema/structure/kron@_here_`` after ``/schema/curvature@_here_``;
``conf/data/uci.yaml`` lists ``/schema/data/uci@_here_``, ``conf/model/mlp.yaml`` ``/schema/model/mlp@_here_``).

Nodes are plain values (not structured configs): types, ranges and unknown keys are checked by
``config.load`` with messages that name the option and the allowed values. Importing
``laplace_lab.config`` registers them (the entry point and the tests' composition import it).
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from laplace_lab.config.schema import GROUPS, RootOptions
from laplace_lab.data.registry import REGISTRY as DATA
from laplace_lab.io.declare import Registry
from laplace_lab.io.fields import defaults
from laplace_lab.laplace.spec import hessian_structures, structure_class
from laplace_lab.models.registry import REGISTRY as MODELS

# The options a data node carries, in the order the job config prints them: the keys its option
# file listed before the nodes existed, so composed configs (and with them sweep identities and
# MAP-cache keys) stay as they were. A data module not named here carries all its options, in the
# order of its ``Options``.
DATA_KEYS = {
    "vision": ("name", "data_dir", "n_val", "n_train_subset", "ood", "ood_if_missing", "augment", "transform",
               "download", "batch_size", "eval_batch_size", "num_workers", "seed", "test_holdout"),
    "uci": ("name", "split", "data_dir", "val_fraction", "batch_size", "seed", "dtype"),
    "toy2d": ("kind", "n_train", "n_val", "n_test", "noise", "batch_size", "seed"),
    "sinusoid": ("n_train", "n_val", "n_test", "noise_std", "batch_size", "seed"),
}


def node_name(cls: type) -> str:
    """The node of a data module or network: its class name in lower case, less ``DataModule``
    (``UCIDataModule`` -> ``uci``, ``WideResNet`` -> ``wideresnet``)."""
    return cls.__name__.removesuffix("DataModule").lower()


def target_nodes(group: str, registry: Registry, keys: dict[str, tuple[str, ...]], wiring: dict) -> dict[str, dict]:
    """``{"<group>/<name>": node}`` of every class of ``registry``: ``_target_``, ``wiring`` (e.g.
    ``_partial_``), then its options' defaults (those of ``keys[name]`` where given, in that order)."""
    out = {}
    for target, cls in registry.classes().items():
        name, options = node_name(cls), defaults(cls.Options)
        unknown = sorted(set(keys.get(name, ())) - set(options))
        if unknown:
            raise ValueError(f"{group} node {name!r} lists {unknown}, not options of {cls.__name__}; allowed: {list(options)}")
        chosen = {k: options[k] for k in keys[name]} if name in keys else options
        out[f"{group}/{name}"] = {"_target_": target, **wiring, **chosen}
    return out


def nodes() -> dict[str, dict]:
    """``{"<group>[/<option>]": node}`` of every schema node, ``"root"``, ``"structure/<name>"``,
    ``"data/<name>"`` and ``"model/<name>"`` (networks are partial: train.py completes them)."""
    out = {"root": defaults(RootOptions)}
    out |= {f"structure/{name}": structure_class(name).option_defaults() for name in hessian_structures()}
    out |= target_nodes("data", DATA, DATA_KEYS, {})
    out |= target_nodes("model", MODELS, {}, {"_partial_": True})
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
