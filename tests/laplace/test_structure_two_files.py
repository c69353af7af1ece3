"""A new posterior structure is two files: its module in ``src/laplace_lab/laplace/structures/`` and
its ``conf/curvature/<name>.yaml`` (docs/architecture.md, "How to add a structure"). This test writes
exactly those two, the module into a temporary folder on the ``laplace_lab.laplace.structures``
package's path and the yaml into a temporary config folder on Hydra's search path, and checks the
fit, the log marginal likelihood (equal to the built-in diag's), the label and a training config
composed with ``curvature=<name>``, with nothing else edited."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from laplace_refs import data, loader, mlp

import laplace_lab.laplace.structures as structures_pkg
from laplace_lab.config.validation import validate_config
from laplace_lab.evaluation.labels import laplace_label
from laplace_lab.laplace import Laplace
from laplace_lab.laplace.spec import hessian_structures
from laplace_lab.laplace.structures import STRUCTURES
from tests.conftest import compose_config

NAME = "diag_copy"

CLASS_FILE = f'''
"""The exact GGN diagonal again, written as a new structure would be: a structure only this test adds."""

import torch

from laplace_lab.laplace.modules import diag_sq
from laplace_lab.laplace.priors import to_diag
from laplace_lab.laplace.structures.base import Structure, register


@register
class DiagCopyStructure(Structure):
    name = "{NAME}"
    label = "diagonal copy"

    def reset(self):
        self.h = torch.zeros(self.n_params, device=self.device, dtype=self.dtype)

    def accumulate(self, records):
        parts = []
        for e, r in zip(self.entries, records):
            d = diag_sq(e.module, e.names, r.calls) if r.calls else {{}}
            parts += [d[n].reshape(-1) if n in d else torch.zeros_like(p).reshape(-1)
                      for n, p in zip(e.names, e.params)]
        self.h += torch.cat(parts)

    @property
    def H(self):
        return self.h

    def precision(self, c, prior):
        return c * self.h + to_diag(prior, self.sizes)

    def logdet(self, c, prior):
        return self.precision(c, prior).log().sum()

    def sample(self, n, c, prior, generator=None):
        return self.randn(n, self.n_params, generator=generator) * self.precision(c, prior).rsqrt()

    def functional_variance(self, Js, c, prior):
        return torch.einsum("ncp,p,nkp->nck", Js, 1.0 / self.precision(c, prior), Js)

    def posterior_variance(self, c, prior):
        return 1.0 / self.precision(c, prior)

    def dense_precision(self, c, prior):
        return torch.diag(self.precision(c, prior))

    def state_dict(self):
        return {{"h": self.h}}

    def load_state_dict(self, sd):
        self.h = sd["h"].to(self.device, self.dtype)
'''

YAML_FILE = f"""
defaults:
  - /schema/curvature@_here_
  - _self_

subset_of_weights: all
hessian_structure: {NAME}
"""


@pytest.fixture
def new_structure(tmp_path, monkeypatch):
    """The two files of a new structure; returns the overrides that compose with its yaml."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "diag_copy.py").write_text(textwrap.dedent(CLASS_FILE))
    conf = tmp_path / "conf" / "curvature"
    conf.mkdir(parents=True)
    (conf / f"{NAME}.yaml").write_text(textwrap.dedent(YAML_FILE))
    monkeypatch.setattr(structures_pkg, "__path__", [*structures_pkg.__path__, str(package)])
    importlib.invalidate_caches()
    assert NAME not in STRUCTURES
    yield [f"curvature={NAME}", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]
    STRUCTURES.pop(NAME, None)
    sys.modules.pop(f"{structures_pkg.__name__}.diag_copy", None)


def test_a_new_structure_is_a_module_and_a_yaml(new_structure):
    assert NAME in hessian_structures()  # the package's discovery imports the new module
    # the config: curvature=<name> composes and passes the training config check
    run = validate_config(compose_config([*new_structure, "prior=diagonal", "curvature.type=ef"]))
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


def test_without_its_module_the_yaml_is_refused(new_structure, monkeypatch):
    monkeypatch.setattr(structures_pkg, "__path__", list(structures_pkg.__path__)[:-1])
    with pytest.raises(ValueError, match=rf"curvature.hessian_structure='{NAME}' is not supported; "
                                         r"allowed: \['diag', 'full', 'kron', 'lowrank'\]"):
        validate_config(compose_config(new_structure))
