"""The Laplace Redux authors' own evaluation code, ``uq.py`` of runame/laplace-redux, run here on our
MAP LeNets beside our post-hoc jobs on the same networks: the paired peer CSV
``authors_uq.csv`` (``laplace_lab.reporting.peer_pairs`` format) that ``../reference.yaml`` judges.

Nothing of the authors' repository is copied into this project. The script takes a checkout of it
(``--authors-repo``; ``git clone https://github.com/runame/laplace-redux`` at ``AUTHORS_COMMIT``) and
a Python environment that runs it (``--authors-python``: a fresh venv with ``pip install
torch==2.14.1 torchvision==0.29.1 laplace-torch==0.3 scikit-learn scipy PyYAML tqdm pycalib
"numpy<2"``: ``uq.py`` imports ``pycalib`` at the top but uses it only for temperature scaling, and
``utils.get_calib`` calls ``np.nan_to_num(x, 0)``, whose second argument numpy 2 reads as
``copy=False`` and fails). It copies the checkout into
``--work-dir``, applies ``PATCH`` there (the fewest changes that make it run offline here) and runs::

    uq.py --benchmark {R-MNIST,MNIST-OOD} --config <config> --run_name <name>

per seed for the MAP network (``method: map``), LA (``configs/post_hoc_laplace/mnist_default.yaml``)
and LA* (``mnist_bestood.yaml``). ``uq.py`` lets its ``--config`` file override the command line, so
each run gets a copy of the authors' config with ``data_root``, ``models_root`` and ``model_seed``
set to ours (every other line as the authors'; for ``map``: ``method: map``, ``seed: 711`` and
``batch_size: 512`` as their configs).

Networks: each seed's MAP LeNet of our sweep (``--sweep-dir``, jobs ``method=la`` and ``la_star``
of ``experiment=redux_mnist``), found in the MAP cache as ``../laplace_torch_reference.py`` finds it,
its parameters written in the authors' layout (``baselines/vanilla/models/lenet.py``: the same
layers) to ``<work-dir>/models/lenet_mnist/lenet_mnist_<seed>_1``, the file ``uq.py`` loads.

Metrics: R-MNIST angle 0 is the MNIST test split ``uq.py`` evaluates (8000 images: ``val_test_split``
with seed 42, our ``data.test_holdout=2000``): accuracy, NLL, confidence, Brier and its ECE
(``utils.get_calib``, which our ``ece_redux`` reproduces); MNIST-OOD gives the FashionMNIST
confidence, AUROC and FPR95 (all 10k FashionMNIST test images, in-distribution scores on those
8000). Our side of each row comes from the seed's finished job (``metrics.json``), its MAP
columns from the ``la`` job. Columns are named after our metric keys without the predictor
(``test/acc``, ``ood/fashion_mnist/conf``, ...); ``method`` is ``map``, ``la`` or ``la_star``.

Resumable: seeds whose ``theirs`` rows are in the CSV are skipped. From the repository root::

    PYTHONPATH=src python experiments/redux_mnist/peer/run_authors_uq.py --authors-repo <checkout> \\
        --authors-python <venv>/bin/python --sweep-dir outputs/redux_mnist_peer_cut --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from laplace_lab.reporting.peer_checkout import PeerCheckoutError, checkout_commit
from laplace_lab.reporting.peer_csv import seal

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
AUTHORS_REPO = "runame/laplace-redux"
AUTHORS_COMMIT = "ac4ee154c22509f12c692a0143c9dcd17b439bee"
# The run-time patch: (file, the authors' text, ours). The CIFAR Fixup WRN is not imported (its ASDL
# import fails with the ASDL laplace-torch 0.3 brings; MNIST never uses it). R-MNIST is evaluated at angle 0 only (the
# in-distribution test split: the CPU cut; our jobs of the cut run no rotation either), and KMNIST
# and EMNIST are not available offline here, so MNIST-OOD evaluates MNIST and FashionMNIST only.
PATCH = [
    ("utils/utils.py",
     "from baselines.vanilla.models import mlp, lenet, wrn, wrn_fixup\n",
     "from baselines.vanilla.models import mlp, lenet, wrn  # laplace-lab peer run: wrn_fixup (CIFAR) imports\n"
     "# asdfghjkl.operations, which the ASDL that laplace-torch 0.3 installs (package asdl) no longer has\n"),
    ("utils/data_utils.py",
     "        if args.benchmark == 'R-MNIST':\n            no_loss_acc = False\n            # here, id is the rotation angle\n"
     "            ids = [0, 15, 30, 45, 60, 75, 90, 105, 120, 135, 150, 165, 180]\n",
     "        if args.benchmark == 'R-MNIST':\n            no_loss_acc = False\n            # here, id is the rotation angle\n"
     "            ids = [0]  # laplace-lab peer run: the unrotated test set only (CPU cut)\n"),
    ("utils/data_utils.py",
     "            ids = ['MNIST', 'EMNIST', 'FMNIST', 'KMNIST']\n",
     "            ids = ['MNIST', 'FMNIST']  # laplace-lab peer run: EMNIST, KMNIST not available offline\n"),
]
METHODS = {"map": None, "la": "configs/post_hoc_laplace/mnist_default.yaml",
           "la_star": "configs/post_hoc_laplace/mnist_bestood.yaml"}
BENCHMARKS = ("R-MNIST", "MNIST-OOD")
# CSV metric column -> (benchmark, id index in uq.py's results list, uq.py metric key)
THEIRS = {
    "test/acc": ("R-MNIST", 0, "acc"), "test/nll": ("R-MNIST", 0, "nll"), "test/conf": ("R-MNIST", 0, "conf"),
    "test/brier": ("R-MNIST", 0, "brier"), "test/ece_redux": ("R-MNIST", 0, "ece"),
    "ood/fashion_mnist/conf": ("MNIST-OOD", 1, "conf"), "ood/fashion_mnist/auroc": ("MNIST-OOD", 1, "auroc"),
    "ood/fashion_mnist/fpr95": ("MNIST-OOD", 1, "fpr95"),
}
COLUMNS = ["side", "seed", "method", "commit", "command", *THEIRS]
DEFAULT_OUT = HERE / "authors_uq.csv"
AUTHORS_TEST_HOLDOUT = 2000  # utils/data_utils.py: val_test_split(val_test_set, val_size=2000)


def ours_key(column: str, method: str) -> str:
    """Our metrics.json key of a CSV column: ``test/acc`` -> ``test/la/acc`` (``map``: ``test/map/acc``)."""
    head, metric = column.rsplit("/", 1)
    return f"{head}/{'map' if method == 'map' else 'la'}/{metric}"


def apply_patch(repo: Path, patch=PATCH) -> None:
    """Edit the copy at ``repo``: each (file, old, new) must find ``old`` exactly once."""
    for rel, old, new in patch:
        path = repo / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise RuntimeError(f"patch does not apply: {rel} has {text.count(old)} copies of {old!r} "
                               f"(expected one: is the checkout at {AUTHORS_COMMIT}?)")
        path.write_text(text.replace(old, new))


def patched_copy(authors_repo: Path, work_dir: Path, patch=PATCH) -> Path:
    """``<work_dir>/laplace-redux``: a copy of the checkout (no ``.git``) with ``patch`` applied,
    made once (an existing copy is reused)."""
    repo = work_dir / "laplace-redux"
    if not repo.exists():
        shutil.copytree(authors_repo, repo, ignore=shutil.ignore_patterns(".git"))
        apply_patch(repo, patch)
    return repo


def patch_diff(patch=PATCH) -> str:
    """The patch as a unified-diff-like text (for the log and the CSV header)."""
    return "\n".join(f"--- {rel}\n-{old.rstrip()}\n+{new.rstrip()}" for rel, old, new in patch)


def to_authors_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our LeNet's parameters in the layout of the authors' ``LeNet.net`` (``nn.Sequential``:
    conv 0, conv 3, linear 7, 9, 11); shapes are checked."""
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    shapes = [(6, 1, 5, 5), (16, 6, 5, 5), (120, 256), (84, 120), (10, 84)]
    if [tuple(m.weight.shape) for m in layers] != shapes or any(m.bias is None for m in layers):
        raise ValueError(f"not the Laplace Redux LeNet: layers {[tuple(m.weight.shape) for m in layers]}, "
                         f"expected {shapes} with biases")
    out = {}
    for index, layer in zip((0, 3, 7, 9, 11), layers):
        out[f"{index}.weight"] = layer.weight.detach().clone()
        out[f"{index}.bias"] = layer.bias.detach().clone()
    return out


def run_config(repo: Path, method: str, data_root: Path, models_root: Path, seed: int) -> dict:
    """The config ``uq.py`` gets: the authors' file with our paths and seed (map: their settings)."""
    if METHODS[method] is None:
        config = {"method": "map", "model": "LeNet", "seed": 711, "batch_size": 512}
    else:
        config = yaml.safe_load((repo / METHODS[method]).read_text())
    config.update({"data_root": str(data_root), "models_root": str(models_root), "model_seed": seed,
                   "download": False})
    return config


def theirs_row(results: dict[str, list[dict]]) -> dict[str, float]:
    """CSV metric columns from ``uq.py``'s saved results (per benchmark: one dict per id)."""
    return {col: float(results[bench][i][key]) for col, (bench, i, key) in THEIRS.items()}


def ours_row(metrics: dict[str, float], method: str) -> dict[str, float | str]:
    return {col: metrics.get(ours_key(col, method), "") for col in THEIRS}


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def write_csv(path: Path, rows: list[dict], header: list[str], methods=METHODS, columns=COLUMNS) -> None:
    """The peer CSV: ``#`` header lines, then ``rows`` sorted by side, seed and ``methods`` order, then
    its row count (``peer_csv.seal``)."""
    rows = sorted(rows, key=lambda r: (r["side"], int(r["seed"]), list(methods).index(r["method"])))
    with path.open("w", newline="") as f:
        f.writelines(f"# {line}\n" for line in header)
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    seal(path)


def _load_finder():
    spec = importlib.util.spec_from_file_location("laplace_torch_reference", HERE.parent / "laplace_torch_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git_head(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def job_commit(job: Path) -> str:
    status = json.loads((job / "status.json").read_text())
    git = status.get("git") or {}
    if git.get("dirty") is not False:
        raise RuntimeError(f"{job} ran on a dirty tree or records no git state: rerun from a clean commit")
    return git["commit"]


def job_command(job: Path) -> str:
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    return "python -m laplace_lab.train " + " ".join(shlex.quote(o) for o in overrides)


def run_uq(authors_python: Path, repo: Path, work_dir: Path, name: str, bench: str, config: dict) -> list[dict]:
    """Run ``uq.py --benchmark bench`` in the patched copy ``repo`` with ``config`` written to
    ``<work_dir>/configs/<name>.yaml`` (one thread, log in ``<work_dir>/logs/<name>.log``); returns
    its saved results (one metrics dict per benchmark id)."""
    config_path = work_dir / "configs" / f"{name}.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config))
    cmd = [str(authors_python), "uq.py", "--benchmark", bench, "--config", str(config_path), "--run_name", name]
    log = work_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"uq.py failed ({proc.returncode}): {shlex.join(cmd)}; see {log}")
    return list(np.load(repo / "results" / f"{name}.npy", allow_pickle=True))


def run_seed(args, finder, seed: int, jobs: dict[str, Path], repo: Path, commit: str) -> list[dict]:
    """Both sides' rows of one seed (runs ``uq.py`` six times)."""
    missing = [m for m in ("la", "la_star") if not (jobs.get(m) and (jobs[m] / "metrics.json").exists())]
    if missing:
        raise RuntimeError(f"seed {seed}: our jobs {missing} have not finished in {args.sweep_dir}")
    for method in ("la", "la_star"):
        holdout = yaml.safe_load((jobs[method] / "config_resolved.yaml").read_text())["data"].get("test_holdout")
        if holdout != AUTHORS_TEST_HOLDOUT:
            raise RuntimeError(f"seed {seed}: our {method} job has data.test_holdout={holdout}; uq.py evaluates "
                               f"{10000 - AUTHORS_TEST_HOLDOUT} test images: run ours with "
                               f"data.test_holdout={AUTHORS_TEST_HOLDOUT} to pair them")
    _, _, module, entry, how = finder.load_job_map(jobs["la"], args.map_cache_dir, str(args.data_dir))
    models_root = args.work_dir / "models"
    (models_root / "lenet_mnist").mkdir(parents=True, exist_ok=True)
    torch.save(to_authors_state_dict(module.model), models_root / "lenet_mnist" / f"lenet_mnist_{seed}_1")
    print(f"seed {seed}: MAP network {entry.name} ({how})", flush=True)
    rows = []
    for method in METHODS:
        results, commands = {}, []
        for bench in BENCHMARKS:
            name = f"{method}_{bench}_{seed}"
            config = run_config(repo, method, args.data_dir, models_root, seed)
            start = time.time()
            results[bench] = run_uq(args.authors_python, repo, args.work_dir, name, bench, config)
            print(f"seed {seed} {method} {bench}: {time.time() - start:.0f} s", flush=True)
            commands.append(f"uq.py --benchmark {bench} --config <{METHODS[method] or 'method: map'}, "
                            f"data_root/models_root ours, model_seed: {seed}>")
        rows.append({"side": "theirs", "seed": seed, "method": method, "commit": commit,
                     "command": " ; ".join(commands), **theirs_row(results)})
        job = jobs["la" if method == "map" else method]
        metrics = json.loads((job / "metrics.json").read_text())
        rows.append({"side": "ours", "seed": seed, "method": method, "commit": job_commit(job),
                     "command": job_command(job), **ours_row(metrics, method)})
    return rows


def portable_command(args) -> str:
    """The command that made the CSV, with this machine's folders as placeholders."""
    sweep = args.sweep_dir.resolve()
    shown = sweep.relative_to(Path.cwd()) if sweep.is_relative_to(Path.cwd()) else Path("<sweep>") / sweep.name
    return ("PYTHONPATH=src python experiments/redux_mnist/peer/run_authors_uq.py --authors-repo <checkout> "
            f"--authors-python <venv>/bin/python --sweep-dir {shown} --seeds {args.seeds}")


def peer_parser(description: str, sweep_help: str, work_dir: str, out: Path) -> argparse.ArgumentParser:
    """The options every authors'-code peer script takes (checkout, its python, our sweep, folders, seeds)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--authors-repo", type=Path, required=True, help=f"a checkout of {AUTHORS_REPO}")
    p.add_argument("--authors-python", type=Path, required=True, help="the python of the environment that runs it")
    p.add_argument("--sweep-dir", type=Path, required=True, help=sweep_help)
    p.add_argument("--map-cache-dir", type=Path, default=None, help="default: the jobs' map_cache.dir")
    p.add_argument("--data-dir", type=Path, default=os.environ.get("LAPLACE_LAB_DATA_DIR"))
    p.add_argument("--work-dir", type=Path, default=Path(work_dir))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", type=Path, default=out)
    p.add_argument("--allow-other-commit", action="store_true", help="run a checkout at another commit")
    return p


def checked_authors_commit(p: argparse.ArgumentParser, args) -> str:
    """The checkout's commit; a usage error without a data folder or at another commit than
    ``AUTHORS_COMMIT`` (unless ``--allow-other-commit``)."""
    if args.data_dir is None:
        p.error("--data-dir: give the data folder (or set LAPLACE_LAB_DATA_DIR)")
    try:
        commit = checkout_commit(args.authors_repo, AUTHORS_REPO, "--authors-repo", AUTHORS_COMMIT)
    except PeerCheckoutError as err:
        p.error(str(err))
    if commit != AUTHORS_COMMIT and not args.allow_other_commit:
        p.error(f"--authors-repo is at {commit}, not {AUTHORS_COMMIT} (--allow-other-commit to run it anyway)")
    return commit


def main(argv: list[str] | None = None) -> None:
    p = peer_parser(__doc__.split("\n\n")[0], "our redux_mnist jobs (la, la_star) of the cut", "outputs/authors_uq_work",
                    DEFAULT_OUT)
    args = p.parse_args(argv)
    commit = checked_authors_commit(p, args)
    seeds = [int(s) for s in args.seeds.split(",")]
    args.work_dir = args.work_dir.resolve()
    args.data_dir = args.data_dir.resolve()
    repo = patched_copy(args.authors_repo, args.work_dir)
    print("run-time patch:\n" + patch_diff(), flush=True)
    finder = _load_finder()
    jobs = finder.sweep_jobs(args.sweep_dir)
    rows = read_csv(args.out)
    done = {int(r["seed"]) for r in rows if r["side"] == "theirs"}
    header = [f"{AUTHORS_REPO} uq.py at {AUTHORS_COMMIT}, run here on our MAP LeNets by "
              "experiments/redux_mnist/peer/run_authors_uq.py (columns: laplace_lab.reporting.peer_pairs)",
              "run-time patch: " + " | ".join(f"{rel}: {old.strip()!r} -> {new.strip()!r}" for rel, old, new in PATCH),
              "test/*: MNIST test split of uq.py (8000 images; ours data.test_holdout=2000); test/ece_redux: "
              "utils.get_calib (M=100); ood/fashion_mnist/*: all 10k FashionMNIST test images",
              f"command: {portable_command(args)}"]
    for seed in seeds:
        if seed in done:
            print(f"seed {seed}: in {args.out}, skipped")
            continue
        if seed not in jobs:
            raise RuntimeError(f"seed {seed}: no job in {args.sweep_dir}")
        rows = [r for r in rows if int(r["seed"]) != seed] + run_seed(args, finder, seed, jobs[seed], repo, commit)
        write_csv(args.out, rows, header)
        print(f"seed {seed}: written to {args.out}", flush=True)


if __name__ == "__main__":
    main()
