"""Every ``python -m laplace_lab.train ...`` command printed in the docs, the experiment READMEs and
the presets' headers parses as Hydra overrides and sweeps no ``hydra.*`` key (Hydra stops such a
command at once: "Sweeping over Hydra's configuration is not supported"; quote the list instead,
``'hydra.sweeper.params.seed="0,1"'``). Static: Hydra's own override parser, nothing is run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "experiments").glob("*/README.md"),
                ROOT / "experiments" / "README.md", *(ROOT / "experiments").glob("*/*.yaml")])
TRAIN = re.compile(r"python -m laplace_lab\.train\b")


def documented_commands(text: str) -> list[str]:
    """The argument strings of the training commands in ``text``: inline code spans, lines of code
    blocks and ``#`` comment lines (preset headers), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    spans = re.findall(r"`([^`\n]*python -m laplace_lab\.train[^`\n]*)`", text)
    lines = [line for line in text.splitlines() if TRAIN.search(line) and "`" not in line]
    return [TRAIN.split(s, maxsplit=1)[1] for s in spans + lines]


def bad_overrides(args: str) -> list[str]:
    """The problems of one command's overrides: unparsable, or a sweep over a ``hydra.`` key."""
    try:
        tokens = shlex.split(args, comments=True)
    except ValueError:
        return []  # prose around the command (an unmatched quote): not a command line
    tokens = [t for t in tokens if "=" in t and not t.startswith(("-", "[")) and "<" not in t and "..." not in t]
    problems = []
    parser = OverridesParser.create()
    for token in tokens:
        try:
            (override,) = parser.parse_overrides([token])
        except Exception as err:  # hydra's OverrideParseException and grammar errors
            problems.append(f"{token!r}: {err}")
            continue
        if override.get_key_element().lstrip("+~").startswith("hydra.") and override.is_sweep_override():
            problems.append(f"{token!r}: Hydra cannot sweep a hydra.* key; quote the list: "
                            f"'{override.get_key_element()}=\"{','.join(map(str, override.sweep_string_iterator()))}\"'")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_documented_training_commands_parse(page):
    problems = [f"{page.relative_to(ROOT)}: {p}" for args in documented_commands(page.read_text())
                for p in bad_overrides(args)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_unquoted_hydra_sweep():
    text = ("Run `python -m laplace_lab.train experiment=x hydra.sweeper.params.method=a,b` or\n"
            "# python -m laplace_lab.train experiment=x 'hydra.sweeper.params.method=\"a,b\"' seed=0,1\n")
    commands = documented_commands(text)
    assert len(commands) == 2
    assert bad_overrides(commands[0]) and "quote the list" in bad_overrides(commands[0])[0]
    assert bad_overrides(commands[1]) == []
