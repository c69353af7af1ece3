"""A data module's and a network's option defaults are declared once, on the class: each
``conf/data`` and ``conf/model`` file starts from its class's schema node (``config.store``) and
states only values that differ (besides ``_target_``, ``_partial_``, interpolations and the ``name``
of the set a file is for)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from laplace_lab.config import CONF_DIR
from laplace_lab.config.store import node_name, nodes
from laplace_lab.data.registry import REGISTRY as DATA
from laplace_lab.io.declare import is_wiring
from laplace_lab.io.fields import defaults
from laplace_lab.models.registry import REGISTRY as MODELS

FILES = sorted((CONF_DIR / group / path.name, group) for group in ("data", "model")
               for path in (CONF_DIR / group).glob("*.yaml"))


def _chain(path):
    """The option file and the files of its group it starts from (``defaults``), nearest first."""
    raw = OmegaConf.load(path)
    parents = [d for d in raw.get("defaults", []) if isinstance(d, str) and d != "_self_" and not d.startswith("/")]
    return [(path, raw), *(c for p in parents for c in _chain(path.parent / f"{p}.yaml"))]


@pytest.mark.parametrize("path,group", FILES, ids=[f"{g}/{p.stem}" for p, g in FILES])
def test_an_option_file_starts_from_its_class_node_and_states_only_what_differs(path, group):
    chain = _chain(path)
    registry = DATA if group == "data" else MODELS
    cls = registry.find(next(raw["_target_"] for _, raw in chain if "_target_" in raw))
    node = f"/schema/{group}/{node_name(cls)}@_here_"
    assert any(node in raw.get("defaults", []) for _, raw in chain), f"{path.name} does not list {node}"
    declared, raw = defaults(cls.Options), OmegaConf.load(path)
    stated = OmegaConf.to_container(raw, resolve=False)
    for key, value in stated.items():
        if key in ("defaults", "name") or is_wiring(key) or OmegaConf.is_interpolation(raw, key):
            continue
        assert value != declared[key], (
            f"{group}/{path.stem}.yaml restates {key}={value!r}, the default of {cls.__name__}.Options")

def test_every_class_has_a_node_with_its_target():
    for group, registry in (("data", DATA), ("model", MODELS)):
        for target, cls in registry.classes().items():
            assert nodes()[f"{group}/{node_name(cls)}"]["_target_"] == target
