"""The peer scripts' checkout of the authors' repository (``experiments/*/peer/``), read with an
error that says what to do instead of a ``CalledProcessError`` from ``git rev-parse``.

``checkout_commit(path, repo, option, commit)``: the ``HEAD`` commit of the checkout at ``path``;
``PeerCheckoutError`` (a ``ValueError``) when ``path`` is not given, is not a folder or is not a git
checkout, naming the option and the command that makes one (``git clone https://github.com/<repo>``,
then ``git checkout <commit>`` where the script pins one). Standard library only: the scripts that
run in the authors' environment import it too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


class PeerCheckoutError(ValueError):
    """The authors' checkout a peer script needs is missing or not a git checkout."""


def clone_advice(repo: str, path: str | Path | None, commit: str | None = None) -> str:
    where = str(path) if path else "<folder>"
    advice = f"git clone https://github.com/{repo} {where}"
    return advice + (f" && git -C {where} checkout {commit}" if commit else "")


def checkout_commit(path: str | Path | None, repo: str, option: str, commit: str | None = None,
                    needs: str | None = None) -> str:
    """``HEAD`` of the checkout of GitHub ``repo`` (``owner/name``) at ``path`` (given as ``option``);
    ``needs``: a file the checkout must hold (e.g. ``marglik.py``), else a ``PeerCheckoutError``."""
    if path is None or not Path(path).is_dir():
        what = "is required" if path is None else f"{str(path)!r} is not a folder"
        raise PeerCheckoutError(f"{option} {what}: it is a checkout of the authors' repository {repo}; make one "
                                f"with: {clone_advice(repo, path, commit)}")
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PeerCheckoutError(f"{option} {str(path)!r} is not a git checkout ({proc.stderr.strip() or 'git failed'})"
                                f"; the script needs a checkout of {repo}: {clone_advice(repo, path, commit)}")
    if needs and not (Path(path) / needs).is_file():
        raise PeerCheckoutError(f"{option}: {path} is not a checkout of {repo} (no {needs} in it)")
    return proc.stdout.strip()
