"""The MoLA authors' own code, ``uq.py`` of runame/laplace-redux with ``--method ensemble`` and
``--method mola`` (``--nr_components 5``), run here on the 5 LeNet members of our
``eschenhagen2021_mnist_cpu`` jobs (MNIST and FashionMNIST), beside our deep ensemble (``de``) and
MoLA (``mola``) of the same networks: the paired peer CSV ``authors_mola.csv``
(``laplace_lab.reporting.peer_pairs`` format) that ``../reference.yaml`` judges.

Nothing of the authors' repository is copied into this project: as
``experiments/redux_mnist/peer/run_authors_uq.py`` (whose options, checkout check, run-time patch,
layout conversion and ``uq.py`` runner this script imports), it takes a checkout (``--authors-repo``,
at ``AUTHORS_COMMIT``) and a Python that runs it (``--authors-python``; how to make one: that script's
docstring), copies the checkout into ``--work-dir``, applies ``PATCH`` and runs, per data set and seed::

    uq.py --benchmark {R-MNIST,MNIST-OOD | R-FMNIST,FMNIST-OOD} --config <config> --run_name <name>

``PATCH``: that script's (R-MNIST at angle 0 only, MNIST-OOD without the EMNIST/KMNIST sets that are
not available offline, the CIFAR Fixup import dropped) and ``FMNIST_PATCH``: ``load_pretrained_model``
loads ``lenet_fmnist/lenet_fmnist_<seed>.pt`` for every component (no component index: the authors'
FashionMNIST mixture would be one network five times), patched to ``lenet_fmnist_<seed>_<k+1>.pt``,
and the FashionMNIST data branch is cut as the MNIST one.

``de``: ``method: ensemble, nr_components: 5, model: LeNet`` (``run_uq_baselines.sh``'s deep-ensemble
line; every other option at ``uq.py``'s defaults). ``mola``: the authors' LA config
``configs/post_hoc_laplace/mnist_default.yaml`` (last-layer KFAC-GGN, GLM probit, ``prior_precision:
1.``) with ``method: mola, nr_components: 5`` and ``optimize_prior_precision: null``: ``uq.py`` stops
on ``mola`` with a prior optimiser ("optimizing the prior precision for MoLA is not supported yet"),
so its MoLA uses the config's fixed prior precision 1 for every member. The repository has no MoLA
config or script of its own (``run_uq_baselines.sh`` runs only ``ensemble``), nor a FashionMNIST
post-hoc config (the MNIST one is used for both); the MoLA paper's setting could not be read offline.

Networks: member ``k`` of seed ``s`` is the MAP network our job ``data=<d>,seed=s`` trained with
seed ``s + 1000 k`` (``training/ensemble.py``), found in the MAP cache as
``../../redux_mnist/laplace_torch_reference.py`` finds a job's network (with the member's seed),
checked by our deep ensemble's test accuracy and NLL on the full test set against the job's
``test/de/*``, and written in the authors' layout where the patched ``uq.py`` loads it
(``member_path``).

Our side, with our library on the same images: ``de`` = ``mixture_predictor`` of the members'
``map_predictor``; ``mola`` = ``mixture_predictor`` of their ``laplace_predictor``, each Laplace fitted
by ``fit_posthoc_laplace`` with the job's curvature and predictive (last-layer KFAC-GGN, probit) at
the authors' fixed prior precision 1 (``marglik.posthoc_prior: none``; the table's own MoLA tunes each
member's prior by marglik instead: not this row). Evaluated by ``run_evaluation`` on ``uq.py``'s
8000-image test split (``hold_out_test(test, 2000)``: ``val_test_split`` with seed 42) and all 10k
test images of the other data set (the OOD set).

Resumable: a (data set, side, seed) whose rows are in the CSV is skipped. From the repository root::

    PYTHONPATH=src python experiments/eschenhagen2021_mnist_cpu/peer/run_authors_mola.py --authors-repo <checkout> \\
        --authors-python <venv>/bin/python --sweep-dir <outputs>/eschenhagen2021_mnist_cpu/multirun \\
        --data mnist,fashion_mnist --seeds 0,1,2
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REDUX_PEER = ROOT / "experiments" / "redux_mnist" / "peer"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


uq = _load(REDUX_PEER / "run_authors_uq.py", "run_authors_uq")

MEMBERS = 5
FIXED_PRIOR = 1.0  # configs/post_hoc_laplace/mnist_default.yaml: prior_precision: 1. (uq.py's default too)
MOLA_CONFIG = "configs/post_hoc_laplace/mnist_default.yaml"
METHODS = {"de": "ensemble", "mola": "mola"}  # CSV method (our predictor) -> uq.py --method


def _fmnist_branch(angles: str, sets: str) -> str:
    """``utils/data_utils.py``'s R-FMNIST / FMNIST-OOD branch of ``get_in_distribution_data_loaders``."""
    return ("    elif args.benchmark in ['R-FMNIST', 'FMNIST-OOD']:\n"
            "        if args.benchmark == 'R-FMNIST':\n            no_loss_acc = False\n"
            f"            # here, id is the rotation angle\n            ids = {angles}\n"
            "        else:\n            no_loss_acc = True\n"
            f"            # here, id is the name of the dataset\n            ids = {sets}\n"
            "        train_loader, val_loader, in_test_loader = get_fmnist_loaders(\n"
            "            args.data_root,\n            model_class=args.model,\n            batch_size=args.batch_size,\n"
            "            val_size=args.val_set_size,\n            download=args.download,\n"
            "            device=device)\n\n")


# The run-time patch: run_authors_uq.PATCH (MNIST) and, for FashionMNIST, one file per mixture
# component (the authors load lenet_fmnist_<seed>.pt for every component) and the FashionMNIST branch
# cut as the MNIST one (angle 0; EMNIST and KMNIST not available offline). The authors' file has
# that branch twice in a row (the second copy can never run): the patch replaces both by one.
FMNIST_PATCH = [
    ("utils/utils.py",
     "                         else fpath.format(args.model_seed))\n",
     "                         else fpath.format(f'{args.model_seed}_{model_idx+1}'))  # laplace-lab peer run: "
     "one FashionMNIST network per component\n"),
    ("utils/data_utils.py",
     2 * _fmnist_branch("[0, 15, 30, 45, 60, 75, 90, 105, 120, 135, 150, 165, 180]",
                        "['FMNIST', 'EMNIST', 'MNIST', 'KMNIST']"),
     _fmnist_branch("[0]  # laplace-lab peer run: the unrotated test set only (CPU cut)",
                    "['FMNIST', 'MNIST']  # laplace-lab peer run: EMNIST, KMNIST not available offline; the "
                    "authors' second (unreachable) copy of this branch removed")),
]
PATCH = uq.PATCH + FMNIST_PATCH
TEST_COLUMNS = [c for c in uq.THEIRS if c.startswith("test/")]
# per data set: uq.py's benchmarks (in-distribution, OOD), our OOD set and the member file layout
DATASETS = {
    "mnist": {"benchmarks": ("R-MNIST", "MNIST-OOD"), "ood": "fashion_mnist",
              "file": "lenet_mnist/lenet_mnist_{seed}_{k}", "prefix": ""},
    "fashion_mnist": {"benchmarks": ("R-FMNIST", "FMNIST-OOD"), "ood": "mnist",
                      "file": "lenet_fmnist/lenet_fmnist_{seed}_{k}.pt", "prefix": "net."},
}
OOD_METRICS = ("conf", "auroc", "fpr95")
# CSV metric column -> (benchmark index 0/1, id index in uq.py's results list, uq.py metric key)
THEIRS = {
    **{c: (0, 0, uq.THEIRS[c][2]) for c in TEST_COLUMNS},
    **{f"ood/{o}/{m}": (1, 1, m) for o in ("fashion_mnist", "mnist") for m in OOD_METRICS},
}
COLUMNS = ["side", "seed", "data", "method", "commit", "command", *THEIRS]
DEFAULT_OUT = HERE / "authors_mola.csv"
DE_CHECK = ("test/de/acc", "test/de/nll")  # all 10k test images: must equal the job's (same networks)
DE_CHECK_TOL = 1e-4


def member_path(models_root: Path, data: str, seed: int, k: int) -> Path:
    """The file the patched ``uq.py`` loads for component ``k`` (0-based) of ``model_seed: seed``."""
    return models_root / DATASETS[data]["file"].format(seed=seed, k=k + 1)


def member_state_dict(model: torch.nn.Module, data: str) -> dict[str, torch.Tensor]:
    """Our LeNet in the authors' layout: ``LeNet.net``'s keys for MNIST (``uq.py`` loads into
    ``model.net``), ``net.``-prefixed for FashionMNIST (loaded into the ``LeNet`` itself)."""
    prefix = DATASETS[data]["prefix"]
    return {prefix + k: v for k, v in uq.to_authors_state_dict(model).items()}


def theirs_row(data: str, results: dict[str, list[dict]]) -> dict[str, float | str]:
    """CSV metric columns from ``uq.py``'s saved results of the data set's two benchmarks; the other
    data set's OOD columns are empty."""
    benches, ood = DATASETS[data]["benchmarks"], DATASETS[data]["ood"]
    return {col: (float(results[benches[b]][i][key]) if col.startswith(("test/", f"ood/{ood}/")) else "")
            for col, (b, i, key) in THEIRS.items()}


def run_config(repo: Path, method: str, data_root: Path, models_root: Path, seed: int) -> dict:
    """The config ``uq.py`` gets for ``de`` or ``mola`` (see the module docstring)."""
    if method == "de":
        config = {"method": "ensemble", "nr_components": MEMBERS, "model": "LeNet"}
    elif method == "mola":
        config = yaml.safe_load((repo / MOLA_CONFIG).read_text())
        config.update({"method": "mola", "nr_components": MEMBERS, "optimize_prior_precision": None})
        if float(config["prior_precision"]) != FIXED_PRIOR:
            raise RuntimeError(f"{MOLA_CONFIG} has prior_precision {config['prior_precision']}, not {FIXED_PRIOR}: "
                               "is the checkout at the expected commit?")
    else:
        raise ValueError(f"method={method!r} is not supported; allowed: {list(METHODS)}")
    config.update({"data_root": str(data_root), "models_root": str(models_root), "model_seed": seed,
                   "download": False})
    return config


def theirs_command(data: str, method: str, seed: int) -> str:
    what = ("method: ensemble, nr_components: 5" if method == "de" else
            f"{MOLA_CONFIG} with method: mola, nr_components: 5, optimize_prior_precision: null")
    return " ; ".join(f"uq.py --benchmark {b} --config <{what}, data_root/models_root ours, model_seed: {seed}>"
                      for b in DATASETS[data]["benchmarks"])


def ours_row(metrics: dict[str, float], method: str) -> dict[str, float | str]:
    """CSV metric columns from our evaluation's keys (``test/acc`` <- ``test/<method>/acc``)."""
    out = {}
    for col in THEIRS:
        head, metric = col.rsplit("/", 1)
        out[col] = metrics.get(f"{head}/{method}/{metric}", "")
    return out


def set_member_seed(cfg, k: int) -> None:
    """Turn a job's resolved config into member ``k``'s: the root seed and ``data.seed`` (the one
    ``${seed}`` interpolation of the vision data configs) become ``seed + k * seed_stride``."""
    from laplace_lab.training.ensemble import member_seed

    seed = member_seed(cfg.seed, k, cfg.ensemble.seed_stride)
    cfg.seed = seed
    cfg.data.seed = seed


def mola_jobs(sweep_dir: Path) -> dict[tuple[str, int], Path]:
    """``{(data, seed): job folder}`` of the sweep's MoLA jobs."""
    jobs = {}
    for cfg_path in sorted(sweep_dir.glob("*/config_resolved.yaml")):
        cfg = OmegaConf.load(cfg_path)
        if cfg.method_name == "mola":
            jobs[str(cfg.data.name), int(cfg.seed)] = cfg_path.parent
    if not jobs:
        raise FileNotFoundError(f"--sweep-dir {sweep_dir} has no method_name=mola job folders")
    return jobs


def load_members(finder, job: Path, cache_dir: Path | None, data_dir: Path) -> list[tuple]:
    """``[(cfg, datamodule, module, entry, how)]`` of the job's members ``0..MEMBERS-1``."""
    cfg = OmegaConf.load(job / "config_resolved.yaml")
    if int(cfg.ensemble.size) != MEMBERS or int(cfg.data.test_holdout) != 0:
        raise RuntimeError(f"{job}: ensemble.size={cfg.ensemble.size}, data.test_holdout={cfg.data.test_holdout}; "
                           f"expected {MEMBERS} members and the full test set")
    return [finder.load_job_map(job, cache_dir, str(data_dir), edit=functools.partial(set_member_seed, k=k))
            for k in range(MEMBERS)]


@torch.no_grad()
def ensemble_check(members: list[tuple], job_metrics: dict) -> dict[str, float]:
    """Our deep ensemble's accuracy and NLL on the job's (full) test set; an error when they differ
    from the job's ``test/de/*`` (then a member is not the network the job used)."""
    loader = members[0][1].test_dataloader()
    correct, nll, n = 0.0, 0.0, 0
    for x, y in loader:
        p = torch.stack([m[2].model(x).softmax(-1) for m in members]).mean(0).double()
        correct += float((p.argmax(-1) == y).sum())
        nll -= float(p.gather(1, y[:, None]).clamp_min(1e-300).log().sum())
        n += len(y)
    ours = {"test/de/acc": correct / n, "test/de/nll": nll / n}
    bad = {k: (ours[k], job_metrics[k]) for k in DE_CHECK if abs(ours[k] - job_metrics[k]) > DE_CHECK_TOL}
    if bad:
        raise RuntimeError(f"deep-ensemble metrics differ from the job's ({bad}, ours vs the job's): the members "
                           "found are not the networks the job used")
    return ours


def ours_metrics(finder, members: list[tuple], out_dir: Path) -> dict[str, float]:
    """Our ``de`` and ``mola`` (fixed prior ``FIXED_PRIOR``) on uq.py's 8000 test images and FashionMNIST."""
    from laplace_lab.config.load import load_run_config
    from laplace_lab.data.vision import hold_out_test
    from laplace_lab.evaluation import EvalData, EvaluationPlan, run_evaluation
    from laplace_lab.evaluation import options as eval_options
    from laplace_lab.training.posthoc import fit_posthoc_laplace
    from laplace_lab.training.predictors import laplace_predictor, map_predictor, mixture_predictor

    plugins, laplaces = [], []
    for cfg, datamodule, module, _, _ in members:
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        cfg.marglik.posthoc_prior = "none"
        run = load_run_config(cfg)
        module.set_prior_precision(FIXED_PRIOR)
        la, info = fit_posthoc_laplace(run, module, datamodule)
        if not torch.allclose(la.prior_precision.float(), torch.tensor(FIXED_PRIOR)):
            raise RuntimeError(f"the Laplace's prior precision is {la.prior_precision}, not {FIXED_PRIOR}")
        print(f"  member seed {run.seed}: Laplace fit {info['laplace/fit_time_s']:.0f} s", flush=True)
        plugins.append(map_predictor(module))
        laplaces.append(laplace_predictor(la, run.predictive))
    cfg0, dm0 = members[0][0], members[0][1]
    dm0.test_set = hold_out_test(dm0.test_set, uq.AUTHORS_TEST_HOLDOUT)
    eval_cfg = finder.evaluation_config(cfg0.evaluation)
    eval_cfg.ood.noise = False
    eval_cfg.ood.far_away = False
    predictors = {"de": mixture_predictor(plugins, "classification"),
                  "mola": mixture_predictor(laplaces, "classification")}
    ood = {k: v for k, v in dm0.ood_dataloaders().items() if k == DATASETS[str(cfg0.data.name)]["ood"]}
    data = EvalData(dm0.test_dataloader(), ood, dataset=str(cfg0.data.name), input_range=dm0.input_range)
    return run_evaluation(EvaluationPlan(eval_options.evaluation_config(eval_cfg), "classification", predictors, data,
                                         attack_model=members[0][2].model, out_dir=out_dir))


def our_commit() -> str:
    """This checkout's HEAD; an error when tracked files other than the peer CSVs have changes."""
    status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    dirty = [line for line in status if not line.rstrip().endswith(".csv")]
    if dirty:
        raise RuntimeError(f"our side runs on a dirty tree ({dirty}): commit first, the rows record the commit")
    return uq.git_head(ROOT)


def portable_command(args) -> str:
    return ("PYTHONPATH=src python experiments/eschenhagen2021_mnist_cpu/peer/run_authors_mola.py --authors-repo <checkout> "
            f"--authors-python <venv>/bin/python --sweep-dir <outputs>/{args.sweep_dir.parent.name}/"
            f"{args.sweep_dir.name} --data {args.data} --seeds {args.seeds}")


def header(args, jobs_commit: str) -> list[str]:
    return [f"{uq.AUTHORS_REPO} uq.py at {uq.AUTHORS_COMMIT} (--method ensemble / mola, --nr_components 5), run "
            f"here on the 5 members of our {args.sweep_dir.parent.name} jobs ({jobs_commit[:7]}) by "
            "experiments/eschenhagen2021_mnist_cpu/peer/run_authors_mola.py (columns: laplace_lab.reporting.peer_pairs)",
            "run-time patch: " + " | ".join(f"{rel}: {old.strip()!r} -> {new.strip()!r}" for rel, old, new in PATCH),
            f"mola: {MOLA_CONFIG} (last-layer KFAC-GGN, GLM probit) with optimize_prior_precision: null (uq.py "
            f"refuses a prior optimiser for mola): fixed prior precision {FIXED_PRIOR} for every member, on both "
            "sides (ours: fit_posthoc_laplace with marglik.posthoc_prior=none; the table's MoLA tunes it by marglik)",
            "test/*: the data set's test split of uq.py (8000 images: hold_out_test 2000, seed 42); test/ece_redux: "
            "utils.get_calib (M=100); ood/<set>/*: all 10k test images of the other data set",
            f"command: {portable_command(args)}"]


def write(args, rows: list[dict], jobs_commit: str) -> None:
    rows.sort(key=lambda r: list(DATASETS).index(r["data"]))  # write_csv's sort is stable: data within method
    uq.write_csv(args.out, rows, header(args, jobs_commit), methods=METHODS, columns=COLUMNS)


def run_theirs(args, repo: Path, data: str, seed: int, members: list[tuple], commit: str) -> list[dict]:
    """The ``theirs`` rows of one data set and seed: the members written where ``uq.py`` loads
    them, then ``uq.py`` for ``de`` and ``mola`` on the data set's two benchmarks."""
    models_root = args.work_dir / "models"
    for k, member in enumerate(members):
        path = member_path(models_root, data, seed, k)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(member_state_dict(member[2].model, data), path)
    rows = []
    for method in METHODS:
        results = {}
        for bench in DATASETS[data]["benchmarks"]:
            start = time.time()
            config = run_config(repo, method, args.data_dir, models_root, seed)
            results[bench] = uq.run_uq(args.authors_python, repo, args.work_dir, f"{method}_{bench}_{seed}", bench,
                                       config)
            print(f"{data} seed {seed} theirs {method} {bench}: {time.time() - start:.0f} s", flush=True)
        rows.append({"side": "theirs", "seed": seed, "data": data, "method": method, "commit": commit,
                     "command": theirs_command(data, method, seed), **theirs_row(data, results)})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = uq.peer_parser(__doc__.split("\n\n")[0], "the eschenhagen2021_mnist_cpu multirun folder",
                       "outputs/authors_mola_work", DEFAULT_OUT)
    p.add_argument("--data", default=",".join(DATASETS), help=f"comma-separated, from {list(DATASETS)}")
    args = p.parse_args(argv)
    datasets = args.data.split(",")
    bad = [d for d in datasets if d not in DATASETS]
    if bad:
        p.error(f"--data: {bad} are not supported; allowed: {list(DATASETS)}")
    commit = uq.checked_authors_commit(p, args)
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = mola_jobs(args.sweep_dir)
    todo = [(d, s) for d in datasets for s in seeds]
    missing = [ds for ds in todo if ds not in jobs or not (jobs[ds] / "metrics.json").exists()]
    if missing:
        p.error(f"--data/--seeds: {missing} have no finished MoLA job in {args.sweep_dir}; there: {sorted(jobs)}")
    ours_commit = our_commit()
    args.work_dir, args.data_dir = args.work_dir.resolve(), args.data_dir.resolve()
    repo = uq.patched_copy(args.authors_repo, args.work_dir, PATCH)
    finder = uq._load_finder()
    torch.set_num_threads(1)
    rows = uq.read_csv(args.out)
    for data, seed in todo:
        done = {r["side"] for r in rows if r["data"] == data and int(r["seed"]) == seed}
        if done >= {"ours", "theirs"}:
            print(f"{data} seed {seed}: in {args.out}, skipped", flush=True)
            continue
        job = jobs[data, seed]
        members = load_members(finder, job, args.map_cache_dir, args.data_dir)
        check = ensemble_check(members, json.loads((job / "metrics.json").read_text()))
        print(f"{data} seed {seed}: members {[m[3].name for m in members]} ({members[0][4]}); DE on the full test "
              f"set {check} = the job's", flush=True)
        if "ours" not in done:
            start = time.time()
            with tempfile.TemporaryDirectory() as tmp:
                metrics = ours_metrics(finder, members, Path(tmp))
            print(f"{data} seed {seed} ours de+mola: {time.time() - start:.0f} s", flush=True)
            command = (f"our de/mola of the 5 members of `{uq.job_command(job)}` (job {uq.job_commit(job)[:7]}), "
                       f"Laplace at fixed prior precision {FIXED_PRIOR}: {portable_command(args)}")
            rows += [{"side": "ours", "seed": seed, "data": data, "method": m, "commit": ours_commit,
                      "command": command, **ours_row(metrics, m)} for m in METHODS]
            write(args, rows, uq.job_commit(job))
        if "theirs" not in done:
            rows += run_theirs(args, repo, data, seed, members, commit)
            write(args, rows, uq.job_commit(job))
        print(f"{data} seed {seed}: written to {args.out}", flush=True)


if __name__ == "__main__":
    main()
