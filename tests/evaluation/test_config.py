"""Config group conf/evaluation/: every option file composes and validates; bad values fail early,
naming the option and the allowed values; the schema (evaluation.options) is the one place of the defaults."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from laplace_lab.evaluation.options import EvalConfig, evaluation_config
from laplace_lab.io.fields import defaults

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = ["default", "full", "regression", "toy2d", "none"]


def _compose(name: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=None, overrides=[f"+evaluation={name}"]).evaluation


@pytest.mark.parametrize("name", PRESETS)
def test_presets_compose_and_validate(name):
    cfg = evaluation_config(_compose(name))
    assert isinstance(cfg, EvalConfig)
    expected = {
        "default": (True, False, True),
        "full": (True, True, True),
        "regression": (True, False, True),
        "toy2d": (True, False, True),
        "none": (False, False, True),
    }[name]
    assert (cfg.enabled, cfg.adversarial.enabled, cfg.toy2d.enabled) == expected


def test_default_yaml_is_the_schema():
    assert evaluation_config(_compose("default")) == evaluation_config({}) == EvalConfig()
    assert OmegaConf.to_container(_compose("default")) == defaults(EvalConfig)
    # the option file states no value: the schema node supplies every one
    assert set(OmegaConf.load(CONF / "evaluation" / "default.yaml")) == {"defaults"}


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "default"])
def test_option_files_state_only_what_differs(name):
    """Each key an option file sets differs from the default it replaces."""
    def leaves(node, path=""):
        for k, v in node.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{path}{k}.")
            else:
                yield f"{path}{k}", v

    own = {k: v for k, v in leaves(OmegaConf.to_container(OmegaConf.load(CONF / "evaluation" / f"{name}.yaml")))
           if not k.startswith("defaults")}
    schema = dict(leaves(defaults(EvalConfig)))
    assert own and all(schema[k] != v for k, v in own.items()), own


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"n_bins": 1}, r"evaluation\.n_bins must be >= 2; got 1 \(allowed: integers in \[2, inf\)\)"),
        ({"n_bins": 2.5}, r"evaluation\.n_bins must be >= 2; got 2.5 \(allowed: integers in \[2, inf\)\)"),
        ({"n_bins": "15"}, r"evaluation\.n_bins='15' has the wrong type: got a str; allowed: a number"),
        ({"adversarial": {"attack_model_output": "softmax"}},
         r"evaluation\.adversarial\.attack_model_output='softmax' is not supported; allowed: \['auto', 'logits', 'probs'\]"),
        ({"adversarial": {"epsilons": [0.1, -0.1]}},
         r"evaluation\.adversarial\.epsilons entries must be >= 0; got -0.1 \(allowed: numbers in \[0, inf\)\)"),
        ({"adversarial": {"confmax": {"epsilons": [0.1, "a"]}}},
         r"evaluation\.adversarial\.confmax\.epsilons=\[0.1, 'a'\] must be a list of numbers; got entries \['a'\]"),
        ({"regression": {"coverage_levels": [0.5, 1.0]}},
         r"evaluation\.regression\.coverage_levels entries must be > 0 and < 1; got 1.0 \(allowed: numbers in \(0, 1\)\)"),
        ({"regression": {"coverage_levels": [0.0]}}, r"coverage_levels entries must be > 0 and < 1; got 0.0"),
        ({"input_range": [1.0, 0.0]},
         r"evaluation\.input_range=\[1.0, 0.0\] is not supported; allowed: \[low, high\] with low < high, or null"),
        ({"input_range": [0.0]}, r"evaluation\.input_range=\[0.0\] is not supported"),
        ({"ood": {"far_away_alpha": 0}}, r"evaluation\.ood\.far_away_alpha must be > 0; got 0 \(allowed: numbers in \(0, inf\)\)"),
        ({"shift": {"cifar10c": {"severities": [0, 6]}}},
         r"evaluation\.shift\.cifar10c\.severities entries must be >= 1 and <= 5; got 0 \(allowed: integers in \[1, 5\]\)"),
        ({"shift": {"cifar10c": {"corruptions": "fog"}}},
         r"evaluation\.shift\.cifar10c\.corruptions='fog' has the wrong type: got a str; allowed: a list"),
        ({"shift": {"rotation": {"angles": [0, 400]}}},
         r"evaluation\.shift\.rotation\.angles entries must be >= -360 and <= 360; got 400"),
        ({"ood": {"noise": "yes"}}, r"evaluation\.ood\.noise='yes' has the wrong type: got a str; allowed: a bool"),
        ({"ood": {"datsets": ["svhn"]}},
         r"evaluation\.ood\.datsets is not a known option of the evaluation group; allowed: \[.*'datasets'"),
        ({"ood": {"datasets": [1]}}, r"evaluation\.ood\.datasets=\[1\] must be a list of strings; got entries \[1\]"),
        ({"toy2d": {"class_index": -1}}, r"evaluation\.toy2d\.class_index \(a class index; null: max-confidence\) must be >= 0"),
        ({"shift": {"rotation": {"angles": []}}},
         r"evaluation\.shift\.rotation\.angles=\[\] must not be empty; allowed: a list of one or more numbers"),
    ],
)
def test_invalid_values_raise_naming_the_option(cfg, match):
    with pytest.raises(ValueError, match=match):
        evaluation_config(cfg)


def test_dictconfig_and_overrides():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose(config_name=None, overrides=["+evaluation=full", "evaluation.n_bins=100",
                                                  "evaluation.adversarial.epsilons=[0,0.3]"]).evaluation
    cfg = evaluation_config(c)
    assert cfg.n_bins == 100 and cfg.adversarial.epsilons == [0.0, 0.3]
