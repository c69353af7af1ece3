"""The sweep dashboard in headless Chromium (Debian's ``chromium`` package), opened from the file
system with every host name unresolvable: each run's figures are decoded and drawn, the screenshot
shows them, and the filters hide the other runs.

Slow (a browser start per test): run by ``make test-dashboard``, which installs chromium with apt-get
when it is missing and sets ``LAPLACE_LAB_REQUIRE_CHROMIUM``, and by ``make test-slow``. Skipped when
no ``chromium`` is installed, unless ``LAPLACE_LAB_REQUIRE_CHROMIUM`` is set: then it fails.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from laplace_lab.evaluation.plots import COLORBLIND
from laplace_lab.reporting import dashboard

from .dashboard_sweep import KINDS, SEEDS, draw_figures, make_sweep

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# no network: every host name fails to resolve, so a page that needed one would show nothing
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=5000"]


pytestmark = pytest.mark.slow  # a browser start per test (~2-10 s): `make test-dashboard` / `make test-slow`


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    if CHROMIUM is None:
        message = "headless Chromium not installed (Debian's `chromium` package: `make test-dashboard` installs it)"
        if os.environ.get("LAPLACE_LAB_REQUIRE_CHROMIUM"):
            pytest.fail(message)
        pytest.skip(message)
    return make_sweep(tmp_path_factory.mktemp("browser") / "multirun", draw_figures(), aggregate=False) \
        / dashboard.PAGE_NAME


def chromium(*args: str) -> str:
    done = subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def cards(dom: str) -> list[tuple[dict[str, str], bool, int]]:
    """(swept values, hidden, figures the browser decoded and drew) of every run's card in the rendered DOM."""
    out = []
    for head, body in re.findall(r"<section ([^>]*)>(.*?)</section>", dom, flags=re.S):
        if 'class="run"' in head:
            values = json.loads(html.unescape(re.search(r'data-run="([^"]*)"', head).group(1)))
            out.append((values, " hidden" in head, len(re.findall(r'<img [^>]*data-rendered="yes"', body))))
    return out


def test_every_run_shows_its_figures(page, tmp_path):
    dom = chromium("--dump-dom", page.as_uri())
    n = len(KINDS) * len(SEEDS)
    assert [c[1:] for c in cards(dom)] == [(False, 2)] * n  # the reliability diagram and the histograms
    assert 'data-rendered="no"' not in dom and f"{n} of {n} runs shown" in dom
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=1300,2600", page.as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert (pixels.std(axis=(0, 1)) > 10).all(), "a blank screenshot"
    for color in COLORBLIND[:2]:  # MAP's and Laplace's lines of the figures, drawn on screen
        rgb = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).sum(axis=2) < 30).sum() > 500, f"no {color} pixels: figures not drawn"


def test_the_filters_in_the_address_hide_the_other_runs(page):
    dom = chromium("--dump-dom", f"{page.as_uri()}#data.kind={KINDS[1]}&seed={SEEDS[0]}")
    shown = [values for values, hidden, _ in cards(dom) if not hidden]
    assert shown == [{"data.kind": KINDS[1], "seed": str(SEEDS[0])}]
    assert f"1 of {len(KINDS) * len(SEEDS)} runs shown" in dom
