"""Config group conf/evaluation/: every preset composes and validates; bad values fail early."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from laplace_lab.evaluation import EvalConfig, validate_config

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = ["default", "full", "regression", "toy2d", "none"]


def _compose(name: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=None, overrides=[f"+evaluation={name}"]).evaluation


@pytest.mark.parametrize("name", PRESETS)
def test_presets_compose_and_validate(name):
    cfg = validate_config(_compose(name))
    assert isinstance(cfg, EvalConfig)
    expected = {
        "default": (True, False, True),
        "full": (True, True, True),
        "regression": (True, False, True),
        "toy2d": (True, False, True),
        "none": (False, False, True),
    }[name]
    assert (cfg.enabled, cfg.adversarial.enabled, cfg.toy2d.enabled) == expected


def test_default_yaml_matches_code_defaults():
    assert validate_config(_compose("default")) == validate_config({}) == EvalConfig()


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"n_bins": 1}, r"evaluation\.n_bins=1 must be an integer >= 2"),
        ({"n_bins": "15"}, r"evaluation\.n_bins"),
        ({"adversarial": {"attack_model_output": "softmax"}},
         r"evaluation\.adversarial\.attack_model_output='softmax' is not supported; allowed: \['auto', 'logits', 'probs'\]"),
        ({"adversarial": {"epsilons": [0.1, -0.1]}}, r"evaluation\.adversarial\.epsilons entries must lie in \[0"),
        ({"regression": {"coverage_levels": [0.5, 1.0]}}, r"coverage_levels entries must lie in \(0.0, 1.0\)"),
        ({"input_range": [1.0, 0.0]}, r"evaluation\.input_range.*low < high"),
        ({"ood": {"far_away_alpha": 0}}, r"evaluation\.ood\.far_away_alpha=0 must be a positive number"),
        ({"shift": {"cifar10c": {"severities": [0, 6]}}}, r"severities entries must be integers in \[1, 5\]"),
        ({"ood": {"noise": "yes"}}, r"evaluation\.ood\.noise='yes' must be a boolean"),
        ({"ood": {"datsets": ["svhn"]}}, r"unknown option\(s\) \['evaluation\.ood\.datsets'\]; allowed: .*'datasets'"),
        ({"toy2d": {"class_index": -1}}, r"evaluation\.toy2d\.class_index"),
        ({"shift": {"rotation": {"angles": []}}}, r"angles must not be empty"),
    ],
)
def test_invalid_values_raise_naming_the_option(cfg, match):
    with pytest.raises(ValueError, match=match):
        validate_config(cfg)


def test_dictconfig_and_overrides():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose(config_name=None, overrides=["+evaluation=full", "evaluation.n_bins=100",
                                                  "evaluation.adversarial.epsilons=[0,0.3]"]).evaluation
    cfg = validate_config(c)
    assert cfg.n_bins == 100 and cfg.adversarial.epsilons == (0.0, 0.3)
