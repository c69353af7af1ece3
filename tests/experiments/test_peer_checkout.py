"""The peer scripts with a missing or wrong checkout of the authors' repository: a usage error that
says where to clone it from (``reporting.peer_checkout``), not a ``CalledProcessError`` of
``git rev-parse``; the scripts that run in the authors' environment find the helper without
``PYTHONPATH=src``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from laplace_lab.reporting.peer_checkout import PeerCheckoutError, checkout_commit

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {  # script, its repository option, the repository, the other required arguments
    "lila": ("experiments/immer2022_invariance_cpu/peer/lila_peer.py", "--repo", "tychovdo/lila", ["--data-root", "."]),
    "heteroscedastic": ("experiments/heteroscedastic_uci/peer/heteroscedastic_nn_peer.py", "--repo",
                        "aleximmer/heteroscedastic-nn", ["--data-dir", "."]),
    "redux": ("experiments/redux_mnist/peer/run_authors_uq.py", "--authors-repo", "runame/laplace-redux",
              ["--data-dir", ".", "--authors-python", "python", "--sweep-dir", "."]),
    "marglik": ("experiments/immer2021_uci/peer/marglik_authors_uci.py", "--repo", "aleximmer/marglik", []),
    "marglik_images": ("experiments/immer2021_images_peer_cut/peer/marglik_authors_images.py", "--repo",
                       "aleximmer/marglik", []),
    "mola": ("experiments/eschenhagen2021_mnist_cpu/peer/run_authors_mola.py", "--authors-repo", "runame/laplace-redux",
             ["--data-dir", ".", "--authors-python", "python", "--sweep-dir", "."]),
}


@pytest.mark.slow  # a subprocess per peer script (~11 s in all)
@pytest.mark.parametrize("name", sorted(SCRIPTS))
@pytest.mark.parametrize("checkout", ["missing", "not_git"])
def test_a_missing_checkout_says_where_to_clone_it_from(name, checkout, tmp_path):
    script, option, repo, rest = SCRIPTS[name]
    folder = tmp_path / "checkout"
    if checkout == "not_git":
        folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(ROOT / script), option, str(folder), *rest], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"git clone https://github.com/{repo} {folder}" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "CalledProcessError" not in proc.stderr


def test_checkout_commit_reads_head(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    assert len(checkout_commit(tmp_path, "o/r", "--repo")) == 40
    with pytest.raises(PeerCheckoutError, match=r"--repo: .* is not a checkout of o/r \(no marglik.py in it\)"):
        checkout_commit(tmp_path, "o/r", "--repo", needs="marglik.py")
    (tmp_path / "marglik.py").write_text("")
    assert checkout_commit(tmp_path, "o/r", "--repo", needs="marglik.py") == checkout_commit(tmp_path, "o/r", "--repo")
    with pytest.raises(PeerCheckoutError, match=r"--repo is required: .* git clone https://github.com/o/r <folder> "
                                                r"&& git -C <folder> checkout abc"):
        checkout_commit(None, "o/r", "--repo", "abc")
