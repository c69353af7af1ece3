"""A new posterior structure is two files: its module in ``src/laplace_lab/laplace/structures/`` and
its ``conf/curvature/<name>.yaml`` (docs/architecture.md, "How to add a structure"). This test writes
exactly those two, the module into a temporary folder on the ``laplace_lab.laplace.structures``
package's path and the yaml into a temporary config folder on Hydra's search path, and checks the
fit, the log marginal likelihood (equal to the built-in diag's), the label, a training config
composed with ``curvature=<name>`` and the structure's own option (declared once, in its ``Options``:
a keyword of ``Laplace``, a key of the config with its default, checked with its range), with nothing
else edited."""

from __future__ import annotations

import sys

import pytest
import torch
from hydra.core.config_store import ConfigStore
from hydra.errors import MissingConfigException
from laplace_refs import data, loader, mlp

import laplace_lab.laplace.structures as structures_pkg
from laplace_lab.config.load import load_run_config
from laplace_lab.config.store import register
from laplace_lab.evaluation.labels import laplace_label
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.spec import hessian_structures
from laplace_lab.laplace.structures import STRUCTURES
from tests.conftest import add_two_files, compose_config

NAME = "diag_copy"

CLASS_FILE = f'''
"""The exact GGN diagonal accumulated again, from the public kernel: a structure only this test adds
(its queries are the diagonal structure's)."""

from dataclasses import dataclass

import torch

from laplace_lab.io.fields import option
from laplace_lab.laplace.modules import diag_sq
from laplace_lab.laplace.structures.base import register
from laplace_lab.laplace.structures.diag import DiagStructure


@register
class DiagCopyStructure(DiagStructure):
    name = "{NAME}"
    label = "diagonal copy"
    supports_fused = False
    factor_chunks = False

    @dataclass(frozen=True)
    class Options:
        scale: float = option(1.0, "float", low=0.0, low_open=True)  # the curvature's factor

    def __init__(self, entries, device, dtype, scale: float = Options.scale):
        self.scale = self.check_options({{"scale": scale}}).scale
        super().__init__(entries, device, dtype)

    def accumulate(self, records):
        parts = []
        for e, r in zip(self.entries, records):
            d = diag_sq(e.module, e.names, r.calls) if r.calls else {{}}
            parts += [d[n].reshape(-1) if n in d else torch.zeros_like(p).reshape(-1)
                      for n, p in zip(e.names, e.params)]
        self.h += self.scale * torch.cat(parts)
'''

YAML_FILE = f"""
defaults:
  - /schema/curvature@_here_
  - /schema/structure/{NAME}@_here_
  - _self_

subset_of_weights: all
hessian_structure: {NAME}
"""


@pytest.fixture
def new_structure(tmp_path, monkeypatch):
    """The two files of a new structure; returns the overrides that compose with its yaml. The config
    store is filled again once the module is on the path (a run imports it before filling it)."""
    assert NAME not in STRUCTURES
    yield add_two_files(tmp_path, monkeypatch, structures_pkg, NAME, CLASS_FILE, "curvature", YAML_FILE)
    STRUCTURES.pop(NAME, None)
    sys.modules.pop(f"{structures_pkg.__name__}.{NAME}", None)
    ConfigStore.instance().repo["schema"]["structure"].pop(f"{NAME}.yaml", None)


def test_a_new_structure_is_a_module_and_a_yaml(new_structure):
    assert NAME in hessian_structures()  # the package's discovery imports the new module
    register()
    # the config: curvature=<name> composes and passes the training config check
    run = load_run_config(compose_config([*new_structure, "prior=diagonal", "curvature.type=ef"]))
    assert run.curvature.hessian_structure == NAME and run.curvature.type == "ef"
    assert laplace_label({"curvature": {"subset_of_weights": "all", "hessian_structure": NAME, "type": "ggn"},
                          "predictive": {"pred_type": "glm", "link_approx": "probit"}}).startswith(
        "all-weights diagonal copy-GGN")
    # the engine: it fits, and its log marginal likelihood is the built-in diag's (float64)
    torch.manual_seed(0)
    model = mlp(d_out=3)
    X, y = data("mlp", "classification")
    fitted = {}
    for name in ("diag", NAME):
        la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=name,
                     prior_precision=torch.linspace(0.5, 2.0, 6, dtype=torch.float64))
        la.fit(loader(X, y, 4))
        fitted[name] = la
    assert fitted[NAME].H.dtype == torch.float64 and fitted[NAME].H.abs().sum() > 0
    torch.testing.assert_close(fitted[NAME].H, fitted["diag"].H, rtol=0, atol=1e-12)
    ours, reference = fitted[NAME].log_marginal_likelihood(), fitted["diag"].log_marginal_likelihood()
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)


def test_a_new_structures_option_is_declared_once(new_structure):
    hessian_structures()
    register()
    run = load_run_config(compose_config([*new_structure, "prior=diagonal"]))
    assert run.curvature.structure_options == {"scale": 1.0}  # its default, from its Options
    assert load_run_config(compose_config([*new_structure, "curvature.scale=2"])).curvature.structure_options == {
        "scale": 2}
    with pytest.raises(ValueError, match=r"curvature.scale must be > 0; got 0 \(allowed: numbers in \(0, inf\)\)"):
        load_run_config(compose_config([*new_structure, "curvature.scale=0"]))
    with pytest.raises(ValueError, match=r"curvature.scale is an option of another hessian_structure"):
        load_run_config(compose_config(["curvature=diag", "+curvature.scale=2"]))
    with pytest.raises(ValueError, match=r"^scale must be > 0; got -1"):
        Laplace(mlp(), "classification", hessian_structure=NAME, scale=-1)
    model = mlp(d_out=3)
    X, y = data("mlp", "classification")
    H = []
    for options in ({}, {"scale": 2.0}):  # a keyword of Laplace
        la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=NAME, **options)
        la.fit(loader(X, y, 4))
        H.append(la.H)
    assert H[0].abs().sum() > 0
    torch.testing.assert_close(H[1], 2 * H[0], rtol=1e-6, atol=0)


def test_without_its_module_the_yaml_is_refused(new_structure, monkeypatch, tmp_path):
    monkeypatch.setattr(structures_pkg, "__path__", list(structures_pkg.__path__)[:-1])
    # as a fresh process without the module: its class and the node registered from it are unknown
    STRUCTURES.pop(NAME, None)
    sys.modules.pop(f"{structures_pkg.__name__}.{NAME}", None)
    ConfigStore.instance().repo["schema"]["structure"].pop(f"{NAME}.yaml", None)
    with pytest.raises(MissingConfigException, match=f"Could not load 'schema/structure/{NAME}'"):
        compose_config(new_structure)  # its options' node: no class declares them
    yaml = tmp_path / "conf" / "curvature" / f"{NAME}.yaml"
    yaml.write_text(yaml.read_text().replace(f"  - /schema/structure/{NAME}@_here_\n", ""))
    with pytest.raises(ValueError, match=rf"curvature.hessian_structure='{NAME}' is not supported; "
                                         r"allowed: \['diag', 'full', 'kron', 'lowrank'\]"):
        load_run_config(compose_config(new_structure))
