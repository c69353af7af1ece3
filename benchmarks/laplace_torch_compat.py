"""Run laplace-torch's own test files against this engine (is it a drop-in?).

Usage::

    python benchmarks/laplace_torch_compat.py /path/to/laplace-torch-checkout [--out DIR] [-- pytest args]

Copies the checkout's ``tests/`` into ``DIR`` (default: a temporary directory) and writes there a
package named ``laplace`` whose modules re-export ``laplace_lab.laplace.compat`` (the only change:
their ``import laplace...`` lines resolve to this engine). Names the engine does not provide
become placeholders that raise ``NotImplementedError`` when used, so every test is counted on
its own. Prints pytest's per-file summary. Nothing from the checkout is copied into this repository.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# laplace-torch module -> names it exposes that their tests import (mapped to compat where we have them)
SHIM_MODULES = ("laplace", "laplace.baselaplace", "laplace.lllaplace", "laplace.laplace", "laplace.curvature",
                "laplace.curvature.asdl", "laplace.curvature.backpack", "laplace.curvature.curvlinops",
                "laplace.curvature.asdfghjkl", "laplace.curvature.curvature", "laplace.utils",
                "laplace.utils.matrix", "laplace.utils.feature_extractor", "laplace.utils.enums",
                "laplace.utils.utils", "laplace.utils.subnetmask", "laplace.utils.metrics",
                "laplace.utils.swag", "laplace.subnetlaplace", "laplace.marglik_training")

SHIM = '''"""Test adapter: laplace-torch's module names over laplace_lab.laplace.compat."""
from laplace_lab.laplace.compat import *  # noqa: F401,F403
import laplace_lab.laplace.compat as _compat


def __getattr__(name):
    if hasattr(_compat, name):
        return getattr(_compat, name)
    if name.startswith("__"):
        raise AttributeError(name)

    class _Missing:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(f"{name} is not provided by laplace_lab")

    _Missing.__name__ = name
    return _Missing
'''


def write_shim(root: Path) -> None:
    for mod in SHIM_MODULES:
        parts = mod.split(".")
        d = root.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(SHIM)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="laplace-torch checkout (with tests/)")
    ap.add_argument("--out", type=Path, default=None)
    a, pytest_args = ap.parse_known_args()
    pytest_args = [x for x in pytest_args if x != "--"]
    out = a.out or Path(tempfile.mkdtemp(prefix="lt_compat_"))
    if (out / "tests").exists():
        shutil.rmtree(out / "tests")
    shutil.copytree(a.checkout / "tests", out / "tests")
    write_shim(out)
    report = out / "report.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}",
           *(pytest_args or ["tests"])]
    print("running", " ".join(cmd), "in", out, flush=True)
    rc = subprocess.call(cmd, cwd=out)
    summarise(report)
    return rc


def summarise(report: Path) -> None:
    """Per test file: passed / failed (incl. errors) / skipped, and the most frequent failure messages."""
    import collections
    import xml.etree.ElementTree as ET

    counts = collections.defaultdict(collections.Counter)
    messages = collections.Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("classname", "").rsplit(".", 1)[-1] + ".py"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts[name]["failed"] += 1
            messages[(bad.get("message") or "").splitlines()[0][:110] if bad.get("message") else "?"] += 1
        elif case.find("skipped") is not None:
            counts[name]["skipped"] += 1
        else:
            counts[name]["passed"] += 1
    total = collections.Counter()
    for name, c in sorted(counts.items()):
        total.update(c)
        print(f"{name:28s} passed {c['passed']:4d}  failed {c['failed']:4d}  skipped {c['skipped']:3d}")
    print(f"{'total':28s} passed {total['passed']:4d}  failed {total['failed']:4d}  skipped {total['skipped']:3d}")
    print("most frequent failure messages:")
    for msg, n in messages.most_common(15):
        print(f"{n:5d}  {msg}")


if __name__ == "__main__":
    raise SystemExit(main())
