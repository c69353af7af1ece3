"""Every fenced ``bash`` command of README.md and the docs/ pages runs, the way they say, from a fresh shell.

The README's convention: after ``make run`` the environment is activated once per shell
(``source .venv/bin/activate``). Each command here runs in its own ``bash -c`` whose PATH does not
contain the environment, so a command only works if the README's own activation (done first)
or a ``.venv/bin/...`` prefix makes it work. ``.venv`` stands for the environment running the
tests. All commands run in order (README, then the docs pages by name) in one scratch folder that
links the repository's files (``outputs/`` and ``results/`` land in the scratch folder), so a
``tables`` command finds the sweep an earlier command ran.

Commands are picked up automatically; they are shortened by generic rules only, by appending
overrides (``shorten``): one epoch, a few test batches, image sets cut to a subset (image sets
not on disk here are replaced by ``fake_data``), comma lists of a multirun and the sweeper's
grid cut to two values, Optuna to two trials, the linear-mode solver to one short round. What cannot run here is listed in ``SKIPS`` with
the reason; what is slow is in ``SLOW``: the default test run keeps the first training command
(``make run``) and the commands that train nothing; ``make test-slow`` runs the rest (~6 min on a
busy 2-core machine).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from laplace_lab.data.vision import VISION_DATASETS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the pages whose commands run
VENV = Path(sys.prefix)
TRAIN = re.compile(r"(python -m laplace_lab\.train|laplace-lab-train|make run)\b")
TIMEOUT_S = 600

# (predicate on the command, reason): commands that cannot run on this machine, or that must not
# run inside the test suite.
SKIPS = [
    (lambda c: c.strip() == "make test", "runs the whole default test suite, which contains this test"),
    (lambda c: "submitit_slurm" in c and shutil.which("sbatch") is None, "needs a SLURM cluster (no sbatch here)"),
    (lambda c: ("trainer=gpu" in c or "--device cuda" in c or _preset_needs_gpu(c)) and not _has_cuda(),
     "needs a CUDA GPU"),
    (lambda c: "trainer=ddp" in c, "needs several GPUs (on the CPU: tests/training/test_ddp_train.py)"),
    (lambda c: "git clone" in c or "/tmp/laplace-torch" in c, "needs the network and a laplace-torch checkout"),
    (lambda c: "laplace_lab.reporting.wandb_workspace" in c and "--dry-run" not in c, "saves to a wandb account (network)"),
]
# (predicate, reason): commands marked slow (run by `make test-slow`).
SLOW = [
    (lambda c: "hydra/launcher=ray" in c, "starts a Ray cluster"),
    (lambda c: "hydra/launcher=submitit" in c, "one subprocess per job through submitit"),
    (lambda c: "hydra/sweeper=" in c, "a sweeper plugin's search"),
    (lambda c: _data_choice(c) in VISION_DATASETS and _data_choice(c) != "fake_data", "real image data"),
    (lambda c: "outputs/" in c, "reads what earlier (slow) commands wrote"),
    (lambda c: TRAIN.search(c) and c != FIRST_TRAINING, "a training run (~10-80 s each on a busy 2-core machine)"),
]
# Appended to every training command (keys every config has).
SHORT = ["trainer.max_epochs=1", "trainer.enable_progress_bar=false", "evaluation.progress=false",
         "evaluation.max_test_batches=2", "evaluation.ood.n_generated=64", "evaluation.adversarial.max_batches=1",
         "evaluation.shift.rotation.angles=[0,90]"]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _preset_needs_gpu(command: str) -> bool:
    """The command's preset (``experiment=<name>``) selects ``trainer: gpu``."""
    found = re.findall(r"(?:^|\s)experiment=(\w+)", command)
    preset = ROOT / "experiments" / found[-1] / "preset.yaml" if found else None
    return bool(preset and preset.is_file() and re.search(r"override /trainer: gpu", preset.read_text()))


def _data_choice(command: str) -> str | None:
    found = re.findall(r"(?:^|\s)data=(\w+)", command)
    return found[-1] if found else None


def readme_commands(text: str) -> list[str]:
    """The commands of the ```bash blocks: continuation lines joined, comment-only lines dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return commands


def _data_dir() -> Path:
    return Path(os.environ.get("LAPLACE_LAB_DATA_DIR", ROOT / "data"))


def _sweeper_params(command: str, workdir: Path, env: dict) -> dict:
    """``hydra.sweeper`` of a multirun command, as composed (``--cfg hydra``)."""
    args = shlex.split(TRAIN.sub("", command, count=1), comments=True)
    args = [a for a in args if a not in ("-m", "--multirun") and "," not in re.sub(r"\[.*?\]", "", a)]  # no sweeps
    out = subprocess.run([sys.executable, "-m", "laplace_lab.train", *args, "--cfg", "hydra", "--package",
                          "hydra.sweeper"], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout) or {}  # printed relative to its package (hydra.sweeper)


def shorten(command: str, workdir: Path, env: dict) -> str:
    """The command with the generic shortening rules applied (see the module docstring)."""
    command = re.sub(r"\s#.*$", "", command)  # a trailing comment (the appended overrides go after the command)
    command = re.sub(r"\[(--[^\]]*)\]", r"\1", command)  # optional arguments "[--flag value]": given
    command = command.replace(".venv/", f"{VENV}/")
    if not TRAIN.search(command):
        return command
    multirun = bool(re.search(r"(?:^|\s)(-m|--multirun)(?:\s|$)", command))
    sweep_dir = []
    if multirun and "hydra.sweep.dir" not in command and "experiment=" not in command:
        # the folder the command as printed would use (a later `tables` line of the README reads it),
        # not the one its shortened overrides would name
        from laplace_lab.sweeps.run_only import sweep_dirname

        printed = [a for a in shlex.split(TRAIN.sub("", command, count=1)) if a not in ("-m", "--multirun")]
        sweep_dir = [f'hydra.sweep.dir="outputs/default/{sweep_dirname(printed)}"']
    if multirun:  # comma lists of the command itself: the first two values
        command = re.sub(r"(\s[\w./]+=)([^\s,\[\]]+,[^\s,\[\]]+)(?:,[^\s\[\]]+)+", r"\1\2", command)
    extra = [*SHORT, *sweep_dir]
    data = _data_choice(command)
    if data in VISION_DATASETS and data != "fake_data":
        if all((_data_dir() / f).exists() for f in VISION_DATASETS[data].files):
            extra += ["data.n_train_subset=256", "data.n_val=100", "data.download=false"]
        else:  # not on disk here: FakeData (3x32x32, 10 classes) stands in
            command = re.sub(r"(^|\s)data=\w+", r"\1data=fake_data", command)
    if "evidence_point=linear_mode" in command:  # the linear-mode solver: one short round
        extra += [f"marglik.linear_mode.{k}" for k in ("n_outer=1", "max_newton=2", "cg_max_iter=10", "prior_max_iter=5")]
    if multirun and re.search(r"hydra/sweeper=|experiment=", command):  # else: the basic sweeper, no params
        sweeper = _sweeper_params(command, workdir, env)
        params = {k: str(v) for k, v in (sweeper.get("params") or {}).items()}
        short = {k: ",".join(v.split(",")[:2]) if "(" not in v else v for k, v in params.items()}
        if short != params:  # the whole dict (keys with dots cannot be overridden one by one)
            extra.append("hydra.sweeper.params={" + ",".join(f"{k}:'{v}'" for k, v in short.items()) + "}")
        if "n_trials" in sweeper:
            extra.append("hydra.sweeper.n_trials=2")
    if command.startswith("make run"):
        args = shlex.split(command)[2:]
        return (f"make -o {VENV}/bin/.installed run VENV={VENV} "
                f"ARGS={shlex.quote(' '.join(map(shlex.quote, [*args, *extra])))}")
    return f"{command} {' '.join(map(shlex.quote, extra))}"


def _case(index: int, page: Path, command: str):
    marks = [pytest.mark.skip(reason=reason) for test, reason in SKIPS if test(command)]
    marks += [pytest.mark.slow for test, _ in SLOW if test(command)][:1]
    return pytest.param(command, marks=marks, id=f"{index:02d}-{page.stem}-{command[:60]}")


PAGE_COMMANDS = [(page, c) for page in PAGES for c in readme_commands(page.read_text())]
COMMANDS = [c for _, c in PAGE_COMMANDS]
FIRST_TRAINING = next((c for c in COMMANDS if TRAIN.search(c)), None)  # the default run keeps this one


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A scratch folder with links to the repository's files; results/ is a copy."""
    work = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        if entry.name in {"outputs", "multirun", "results", ".git", ".venv"}:
            continue
        (work / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "results", work / "results")
    return work


def fresh_env() -> dict:
    """A new shell's environment: PATH without the test's environment, 1 thread, wandb off (every run
    would start one: seconds each; test_wandb_offline and sweeps/test_wandb check what it writes)."""
    keep = ("HOME", "USER", "LANG", "TMPDIR", "PYTHONPATH", "LAPLACE_LAB_DATA_DIR", "CI")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV / "bin"]
    return env | {"PATH": os.pathsep.join(path), "WANDB_MODE": "disabled", "WANDB_SILENT": "true",
                  "OMP_NUM_THREADS": "1"}


def test_readme_has_commands():
    assert any(TRAIN.search(c) for c in COMMANDS), "no training command found in README.md"


def test_shortening_rules(tmp_path):
    """The rules on made-up commands (no run)."""
    env = fresh_env()
    cmd = shorten("python -m laplace_lab.train -m seed=0,1,2 model.widths=[50,50] data=cifar10", tmp_path, env)
    if not all((_data_dir() / f).exists() for f in VISION_DATASETS["cifar10"].files):
        assert "data=fake_data" in cmd
    assert "seed=0,1 " in cmd and "model.widths=[50,50]" in cmd and "trainer.max_epochs=1" in cmd
    assert shorten("python -m laplace_lab.reporting.tables out [--name x] [--figures a]", tmp_path, env) == \
        "python -m laplace_lab.reporting.tables out --name x --figures a"
    assert shorten(".venv/bin/python -V", tmp_path, env) == f"{VENV}/bin/python -V"
    grid = shlex.split(shorten("python -m laplace_lab.train -m hydra/sweeper=map_grid", tmp_path, env))
    assert "hydra.sweeper.params={prior.prior_precision:'1e-4,1e-3',seed:'0,1'}" in grid, grid


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the README's commands run inside a virtual environment")
@pytest.mark.parametrize("command", [_case(i, page, c) for i, (page, c) in enumerate(PAGE_COMMANDS)])
def test_readme_command(command, workdir):
    data = _data_choice(command)
    if data == "uci" and not (_data_dir() / "UCI").is_dir():
        msg = f"UCI data not found under {_data_dir()}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    env = fresh_env()
    line = shorten(command, workdir, env)
    script = f"source {VENV}/bin/activate && {line}"
    proc = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"documented command failed: {command}\nran: {line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("**/README.md")),
        ROOT / "benchmarks" / "README.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository(doc):
    """Relative links of the README and docs resolve to files of the repository; no machine paths."""
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:|#", target):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name}: link {target} points outside the repository"
        assert path.exists(), f"{doc.name}: link {target} does not exist"
    assert not re.search(r"/work/|\.\./shared|/home/\w+|/Users/\w+", text), f"{doc.name} names a machine path"


@pytest.mark.parametrize("table", sorted((ROOT / "results").glob("*.md")) + sorted((ROOT / "results").glob("*.csv")),
                         ids=lambda p: p.name)
def test_committed_results_name_no_machine_path(table):
    """Committed tables carry commands and folders relative to the repository, never this machine's paths."""
    assert not re.search(r"/work/|\.\./shared|/home/\w+|/Users/\w+|/root/|/tmp/", table.read_text()), table.name


def test_readme_reads_in_five_minutes():
    """At most 1,200 words (code blocks left out) and no paragraph over 80 words: the rest is in docs/."""
    text = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.S | re.M)
    assert len(text.split()) <= 1200, len(text.split())
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith(("|", "#", "<!--"))]  # tables, headings, a generated table
    longest = max(paragraphs, key=lambda p: len(p.split()))
    assert len(longest.split()) <= 80, longest[:200]


NUMBERED_WORK = re.compile(r"\b(issue|session)[ -]\d+", re.I)


@pytest.mark.parametrize("path", [*PAGES, *sorted((ROOT / "experiments").glob("**/README.md")),
                                  ROOT / "benchmarks" / "README.md", *sorted((ROOT / "results").glob("*.md")),
                                  *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "conf").rglob("*.yaml")),
                                  *sorted((ROOT / "experiments").glob("*/preset.yaml")),
                                  *sorted((ROOT / "experiments").glob("*/smoke.yaml")),
                                  *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_or_session_numbers(path):
    """Code and docs say what is meant, not "issue 15" or "session 7" (which mean nothing to a reader)."""
    if path == Path(__file__):
        return
    found = NUMBERED_WORK.findall(path.read_text()) and NUMBERED_WORK.search(path.read_text()).group(0)
    assert not found, f"{path.relative_to(ROOT)} mentions {found!r}"
