"""The one trust boundary of what a config may name as code, and its checks.

A config is code: Hydra imports a ``_target_`` and calls it, ``logging.config.dictConfig`` calls a
handler ``class`` or a ``()`` factory. Configs reach this package from the command line, from presets,
from a restored job's ``config_resolved.yaml`` and from Hydra's own node (``hydra.callbacks``, the
launcher, the sweeper, ``hydra.job_logging`` / ``hydra.hydra_logging``), so every slot that can name
a callable takes only the classes listed for that slot (``SLOTS``: "``model._target_`` takes one of
[...]"; ``data`` and ``model``: the data modules of ``laplace_lab.data`` and the networks of
``laplace_lab.models``, found by their class, ``data.registry`` and ``models.registry``);
a ``_target_`` anywhere else is refused. No module prefix is allowed: ``torch.`` would admit
``torch.load`` (which unpickles a file), ``laplace_lab.`` would admit functions that copy or write files.

- ``check_targets(data, where, prefix)``: ``ValueError`` naming the first ``_target_`` of a job
  config (resolved: after interpolation) outside its slot's list.
- ``check_hydra_node(config)``: the ``hydra`` node of a composed config. Hydra instantiates it
  itself, before the task function runs, so it is checked where it is composed (below), before its
  interpolations are resolved; therefore no interpolation may create a node inside ``hydra``: a
  resolver outside ``HYDRA_RESOLVERS`` (``oc.create``, ``oc.decode``, ``oc.select``, ...) is refused,
  and an interpolation that is a whole value (``${evil}``) may not point to a mapping or a list.
  The keys that name a callable (``_target_``, ``class``, ``()``) must be literal. The logging
  configs may use the stream and file handlers only, the file under ``${hydra.runtime.output_dir}``,
  formatters without a factory and no ``ext://`` / ``cfg://`` value but the two standard streams;
  Optuna's ``custom_search_space`` (a callable named by text) must be null; ``hydra.job.env_set``
  may not set what decides which code runs (``LD_PRELOAD``, ``PYTHONPATH``, ``PATH``, ...).
- Shell lines and files a launcher or sweeper acts on: ``hydra.launcher.setup`` (lines the SLURM
  batch script runs before the job) takes only the forms of ``SETUP_FORMS`` (``module load cuda/12.1``,
  ``conda activate lab``, ``source .venv/bin/activate``, ``export NAME=value``; literal, no
  ``$``, quotes, ``;`` or ``&``, no code-loading variable), whatever its source, since Hydra does not
  say whether a value came from a committed yaml, a preset or the command line; the Optuna sweeper's
  ``storage`` (an RDB URL it connects to or a sqlite file it creates) is null or a sqlite file in
  the sweep's own folder, ``STORAGE_PREFIX<name>.db``.
- ``guard_hydra_config()``: wraps Hydra's ``ConfigLoaderImpl.load_configuration`` (Hydra 1.3), which
  composes the config of a run, of a multirun and of each job of a sweep, so that
  ``check_hydra_node`` runs on what it returns. This is the earliest point that sees the composed
  config: Hydra configures ``hydra_logging`` right after it, then builds the callbacks, the sweeper,
  the launcher and (per job) ``job_logging``, so nothing of the ``hydra`` node is called before the
  check passes. The options that become folders (``config.paths``) are checked there too. ``laplace_lab.train`` installs it at import; the error is a ``CompactHydraException``
  (Hydra prints the message alone, exit status 1).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from hydra.errors import CompactHydraException

from laplace_lab.config.paths import check_composed


class Registered(AbstractSet):
    """A slot's classes found by their class: the ``REGISTRY`` (``io.declare.Registry``) of module
    ``registry`` (``laplace_lab.data.registry``: every data module of ``laplace_lab.data``;
    ``laplace_lab.models.registry``: every network of ``laplace_lab.models``), so a new one needs no
    entry here. Membership imports the named module of that package only; iterating imports them
    all (for the allowed values of a message)."""

    def __init__(self, registry: str):
        self.registry = registry

    def _registry(self):
        return importlib.import_module(self.registry).REGISTRY

    def __contains__(self, target: object) -> bool:
        return self._registry().find(target) is not None

    def __iter__(self):
        return iter(self._registry().classes())

    def __len__(self) -> int:
        return sum(1 for _ in self)


DATA_MODULES = Registered("laplace_lab.data.registry")
MODELS = Registered("laplace_lab.models.registry")
OPTIMIZERS = frozenset({"torch.optim.Adam", "torch.optim.AdamW", "torch.optim.SGD", "torch.optim.RMSprop"})
SCHEDULERS = frozenset({
    "laplace_lab.training.schedules.StepwiseCosine",
    "torch.optim.lr_scheduler.CosineAnnealingLR", "torch.optim.lr_scheduler.StepLR",
    "torch.optim.lr_scheduler.MultiStepLR", "torch.optim.lr_scheduler.ExponentialLR",
})
TRAINING_CALLBACKS = frozenset({
    "laplace_lab.training.online_marglik.OnlineMarglikCore",
    "laplace_lab.training.invariance_marglik.AugmentationMarglikCore", "laplace_lab.training.callbacks.checkpoints", "laplace_lab.training.callbacks.epoch_eta",
})
HYDRA_CALLBACKS = frozenset({"laplace_lab.sweeps.callback.SweepSummary", "laplace_lab.sweeps.sweep_eta.SweepETA"})
LAUNCHERS = frozenset({
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
})
SWEEPERS = frozenset({
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
})
SAMPLERS = frozenset({
    "optuna.samplers.TPESampler", "optuna.samplers.RandomSampler", "optuna.samplers.CmaEsSampler",
    "optuna.samplers.GridSampler", "optuna.samplers.NSGAIISampler", "optuna.samplers.QMCSampler",
})
# The slots that take a class (``*``: any one key) and what each takes; a ``_target_`` elsewhere is refused.
SLOTS: dict[str, frozenset[str]] = {
    "data": DATA_MODULES,
    "model": MODELS,
    "optimizer": OPTIMIZERS,
    "lr_scheduler": SCHEDULERS,
    "module": frozenset({"laplace_lab.training.module.MAPCore"}),
    "trainer": frozenset({"pytorch_lightning.Trainer"}),  # config.schema.TrainerConfig
    "logger.csv": frozenset({"pytorch_lightning.loggers.CSVLogger"}),  # config.schema.LoggerConfig
    "logger.wandb": frozenset({"pytorch_lightning.loggers.WandbLogger"}),
    "callbacks.*": TRAINING_CALLBACKS,
    "hydra.callbacks.*": HYDRA_CALLBACKS,
    "hydra.callbacks.*.aggregator": frozenset({"laplace_lab.reporting.sweep_table.SweepTable"}),
    "hydra.launcher": LAUNCHERS,
    "hydra.sweeper": SWEEPERS,
    "hydra.sweeper.sampler": SAMPLERS,
}


def allowed_targets() -> frozenset[str]:
    """Every class some slot takes (lists the data modules and networks, which imports them: for messages and tests)."""
    return frozenset().union(*SLOTS.values())


TARGET_KEY = "_target_"
CALLABLE_KEYS = (TARGET_KEY, "class", "()")  # keys whose value Hydra or logging imports and calls

# Resolvers allowed inside ``hydra``: each returns a string or a number (never a node).
HYDRA_RESOLVERS = frozenset({"now", "hydra", "oc.env", "lab_job_subdir", "lab_gpus_per_job"})
# Hydra's records of the command line's text (never instantiated; their interpolations are the overrides')
RECORDS = ("hydra.overrides.", "hydra.job.override_dirname")
LOGGING_NODES = ("hydra.job_logging", "hydra.hydra_logging")
LOGGING_KEYS = {  # logging.config.dictConfig: the keys each part may hold (no "()" factory, no "." attributes)
    "": {"version", "formatters", "filters", "handlers", "root", "loggers", "disable_existing_loggers",
         "incremental"},
    "formatters": {"format", "datefmt", "style", "validate"},
    "filters": {"name"},
    "handlers": {"class", "level", "formatter", "filters", "stream", "filename", "mode", "encoding", "delay"},
    "loggers": {"level", "handlers", "propagate", "filters"},
}
LOG_HANDLERS = frozenset({"logging.StreamHandler", "logging.FileHandler"})
LOG_STREAMS = frozenset({"ext://sys.stdout", "ext://sys.stderr"})
LOG_DIR = "${hydra.runtime.output_dir}/"  # a FileHandler writes under the job's own folder
# hydra.job.env_set names that change what code a job (or a program it starts) loads or runs
CODE_ENV = frozenset({"PATH", "BASH_ENV", "ENV", "PERL5LIB", "NODE_OPTIONS"})
CODE_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON")
# hydra.launcher.setup: each line one of these (names and values without spaces, quotes, $ ; & | ` < >)
_WORD = r"[\w.\-+/:,@=]+"
SETUP_FORMS = {
    "module load|unload|swap <name>...": re.compile(rf"module (load|unload|swap)( {_WORD})+"),
    "module purge": re.compile(r"module purge"),
    "conda activate <name>": re.compile(r"conda activate [\w.\-]+"),
    "source <folder>/bin/activate": re.compile(r"source ([\w.\-/]*/)?bin/activate"),
    "export NAME=<value>": re.compile(rf"export ([A-Za-z_]\w*)=({_WORD})?"),
}
STORAGE_PREFIX = "sqlite:///${hydra.sweep.dir}/"  # an Optuna study's file, in the sweep's own folder
_RESOLVER = re.compile(r"\$\{\s*([A-Za-z_][\w.\-]*)\s*:")
_NAME = re.compile(r"^[\w.\-]+$")


class HydraNodeError(CompactHydraException, ValueError):
    """A ``hydra`` node that names code outside the allowlist (Hydra prints the message alone)."""


def _targets(node: Any, prefix: str):
    """``(dotted key, value)`` of every ``_target_`` in a plain or OmegaConf container (unresolved)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, Mapping):
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == TARGET_KEY:
                yield name, value
            else:
                yield from _targets(value, name)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _targets(value, f"{prefix}[{i}]")


def slot_of(key: str) -> str | None:
    """The ``SLOTS`` pattern that the node holding ``key`` (``<node>._target_``) matches, or None."""
    parts = key.removesuffix(f".{TARGET_KEY}").split(".")
    for pattern in SLOTS:
        want = pattern.split(".")
        if len(want) == len(parts) and all(w in ("*", p) for w, p in zip(want, parts)):
            return pattern
    return None


def check_target(key: str, value: Any, where: str = "") -> None:
    """``ValueError`` unless ``value`` is one of the classes the slot of ``key`` takes."""
    source = f" in {where}" if where else ""
    slot = slot_of(key)
    if slot is None:
        raise ValueError(f"{key}={value!r}{source} is not allowed: {key.removesuffix('.' + TARGET_KEY)} is not a "
                         f"slot that takes a class; allowed slots: {list(SLOTS)} (presets and configs are code: a "
                         "_target_ is imported and called)")
    allowed = SLOTS[slot]
    if isinstance(value, str) and value in allowed:
        return
    raise ValueError(f"{key}={value!r}{source} is not allowed; allowed: {sorted(allowed)} ({slot}.{TARGET_KEY} "
                     "takes one of these: presets and configs are code, a _target_ is imported and called)")


def check_targets(data: Any, where: str = "", prefix: str = "") -> None:
    """Every ``_target_`` of ``data`` (a resolved job config, a preset, a restored
    ``config_resolved.yaml``; ``prefix``: the key ``data`` sits at) is allowed in its slot; ``where``
    names the source in the error (e.g. the file)."""
    for key, value in _targets(data, prefix):
        check_target(key, value, where)


def check_hydra_node(config: Any) -> None:
    """The ``hydra`` node of a composed config (``DictConfig`` or plain mapping), unresolved: no
    interpolation that creates a node, every callable slot literal and allowed, the logging configs
    within ``LOGGING_KEYS``, no Optuna ``custom_search_space``. ``ValueError`` names the key."""
    from omegaconf import OmegaConf

    root = OmegaConf.to_container(config, resolve=False) if OmegaConf.is_config(config) else (config or {})
    hydra = root.get("hydra") if isinstance(root, Mapping) else None
    if not hydra:
        return
    for key, value in _leaves(hydra, "hydra"):
        if isinstance(value, str) and "${" in value and not key.startswith(RECORDS):
            _check_interpolation(root, key, value)
    for key, value in _leaves(hydra, "hydra"):
        if key.rsplit(".", 1)[-1] in CALLABLE_KEYS and isinstance(value, str) and "${" in value:
            raise ValueError(f"{key}={value!r} is not allowed: a key that names a class takes a literal name, "
                             "not an interpolation")
    logging = {name: hydra.get(name.split(".")[1]) for name in LOGGING_NODES}
    rest = {k: v for k, v in hydra.items() if f"hydra.{k}" not in LOGGING_NODES}
    check_targets(rest, prefix="hydra")
    for name, node in logging.items():
        if node is not None:
            _check_logging(node, name)
    env_set = _get(root, "hydra.job.env_set") or {}
    for name in env_set if isinstance(env_set, Mapping) else ():
        if str(name).startswith(CODE_ENV_PREFIXES) or name in CODE_ENV:
            raise ValueError(f"hydra.job.env_set.{name} is not allowed: it changes what code a job loads or runs "
                             f"(refused: {sorted(CODE_ENV)} and names starting with {list(CODE_ENV_PREFIXES)})")
    _check_setup(_get(root, "hydra.launcher.setup"))
    _check_storage(_get(root, "hydra.sweeper.storage"))
    custom = _get(root, "hydra.sweeper.custom_search_space")
    if custom is not None:
        raise ValueError(f"hydra.sweeper.custom_search_space={custom!r} is not allowed; allowed: null (it names a "
                         "function that the sweeper imports and calls)")


def _check_setup(setup: Any) -> None:
    """``hydra.launcher.setup``: null or a list of lines of ``SETUP_FORMS`` (shell the batch script runs)."""
    if setup is None:
        return
    forms = f"allowed: null or a list of lines of the forms {list(SETUP_FORMS)} (shell run before each job)"
    if not isinstance(setup, (list, tuple)):
        raise ValueError(f"hydra.launcher.setup={setup!r} is not allowed; {forms}")
    for i, line in enumerate(setup):
        text = " ".join(line.split()) if isinstance(line, str) else None
        match = next((m for form in SETUP_FORMS.values() if text and (m := form.fullmatch(text))), None)
        if match is None or ".." in text:
            raise ValueError(f"hydra.launcher.setup[{i}]={line!r} is not allowed; {forms}; no '..', '$', quotes, "
                             "';', '&', '|' or redirections")
        if text.startswith("export") and (match[1].startswith(CODE_ENV_PREFIXES) or match[1] in CODE_ENV):
            raise ValueError(f"hydra.launcher.setup[{i}]={line!r} is not allowed: {match[1]} changes what code a "
                             f"job loads or runs (refused: {sorted(CODE_ENV)} and names starting with "
                             f"{list(CODE_ENV_PREFIXES)})")


def _check_storage(storage: Any) -> None:
    """``hydra.sweeper.storage``: null or ``STORAGE_PREFIX<name>.db`` (literal)."""
    name = storage.removeprefix(STORAGE_PREFIX) if isinstance(storage, str) else None
    if storage is None or (name != storage and name.endswith(".db") and _NAME.match(name) and ".." not in name):
        return
    raise ValueError(f"hydra.sweeper.storage={storage!r} is not allowed; allowed: null (the study lives in memory) "
                     f"or a sqlite file in the sweep's own folder, '{STORAGE_PREFIX}<name>.db' (no other "
                     "database URL, no file elsewhere)")


def _leaves(node: Any, prefix: str):
    """``(dotted key, value)`` of every leaf of a plain container (list entries as ``key[i]``)."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{prefix}[{i}]")
    else:
        yield prefix, node


_MISSING = object()


def _get(root: Any, key: str, default: Any = None) -> Any:
    """The unresolved value at dotted ``key`` (``a.b[0]`` not supported: None) of a plain container."""
    node = root
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _whole(value: str) -> str | None:
    """The text inside ``${...}`` when ``value`` is one interpolation and nothing else, else None."""
    text = value.strip()
    if not text.startswith("${") or not text.endswith("}"):
        return None
    depth = 0
    for i, char in enumerate(text[1:], start=1):  # the brace that "${" opens closes at the end
        depth += char == "{"
        depth -= char == "}"
        if depth == 0 and i < len(text) - 1:
            return None
    return text[2:-1].strip()


def _check_interpolation(root: Mapping, key: str, value: str, depth: int = 0) -> None:
    """``value`` (at ``key`` inside ``hydra``, or followed from there) creates no node: only
    ``HYDRA_RESOLVERS``, and a whole-value reference points to a scalar (followed up to 10 links)."""
    bad = sorted(set(_RESOLVER.findall(value)) - HYDRA_RESOLVERS)
    if bad:
        raise ValueError(f"{key}={value!r} is not allowed: the resolver {bad[0]!r} is refused inside hydra "
                         f"(oc.create / oc.decode / oc.select can create a node that Hydra then calls); allowed "
                         f"resolvers: {sorted(HYDRA_RESOLVERS)}")
    inner = _whole(value)
    if inner is None or depth > 10:
        return
    name, colon, arg = inner.partition(":")
    if colon and name.strip() != "hydra":
        return  # a string-valued resolver
    ref = f"hydra.{arg.strip()}" if colon else inner
    if ref.startswith("."):
        return  # relative references stay inside the node they are in, which this check walks
    target = _get(root, ref, _MISSING)
    if isinstance(target, (Mapping, list, tuple)):
        raise ValueError(f"{key}={value!r} is not allowed: an interpolation inside hydra may not insert a node "
                         f"({ref} is a {'mapping' if isinstance(target, Mapping) else 'list'}); write the values "
                         "inside hydra itself")
    if isinstance(target, str) and "${" in target:
        _check_interpolation(root, key, target, depth + 1)


def _check_logging(node: Any, name: str) -> None:
    """A ``logging.config.dictConfig`` node of Hydra: ``LOGGING_KEYS`` only, handlers of ``LOG_HANDLERS``,
    streams of ``LOG_STREAMS``, a file under ``LOG_DIR``; no other ``ext://`` / ``cfg://`` value."""
    if not isinstance(node, Mapping):
        raise ValueError(f"{name} must be a mapping (a logging.config.dictConfig); got {node!r}")
    _known(node, LOGGING_KEYS[""], name)
    for part in ("formatters", "filters", "handlers", "loggers"):
        entries = node.get(part) or {}
        if not isinstance(entries, Mapping):
            raise ValueError(f"{name}.{part} must be a mapping; got {entries!r}")
        for entry, body in entries.items():
            where = f"{name}.{part}.{entry}"
            if not isinstance(body, Mapping):
                raise ValueError(f"{where} must be a mapping; got {body!r}")
            _known(body, LOGGING_KEYS[part], where)
            if part == "handlers":
                _check_handler(body, where)
    if node.get("root") is not None:
        _known(node["root"], LOGGING_KEYS["loggers"], f"{name}.root")
    for key, value in _leaves(node, name):
        if isinstance(value, str) and value.lstrip().startswith(("ext://", "cfg://")) \
                and not (key.endswith(".stream") and value in LOG_STREAMS):
            raise ValueError(f"{key}={value!r} is not allowed: logging imports what ext:// names; allowed only as "
                             f"a handler's stream: {sorted(LOG_STREAMS)}")


def _known(node: Any, allowed: set[str], where: str) -> None:
    if not isinstance(node, Mapping):
        raise ValueError(f"{where} must be a mapping; got {node!r}")
    unknown = sorted(str(k) for k in set(node) - allowed)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not allowed; allowed keys: {sorted(allowed)} (a logging config "
                         "is code: '()' and 'class' name what it calls)")


def _check_handler(body: Mapping, where: str) -> None:
    cls = body.get("class")
    if cls not in LOG_HANDLERS:
        raise ValueError(f"{where}.class={cls!r} is not allowed; allowed: {sorted(LOG_HANDLERS)}")
    stream = body.get("stream")
    if stream is not None and stream not in LOG_STREAMS:
        raise ValueError(f"{where}.stream={stream!r} is not allowed; allowed: {sorted(LOG_STREAMS)}")
    if cls == "logging.FileHandler":
        filename = str(body.get("filename", ""))
        rest = filename.removeprefix(LOG_DIR)
        if rest == filename or not (_NAME.match(rest.replace("${hydra.job.name}", "job")) and ".." not in rest):
            raise ValueError(f"{where}.filename={filename!r} is not allowed: a log file is a plain name in the job's "
                             f"folder, {LOG_DIR}<name>.log (Hydra's default: {LOG_DIR}${{hydra.job.name}}.log)")


def _compact(check, config) -> None:
    try:
        check(config)
    except ValueError as err:
        raise HydraNodeError(str(err)) from None


@functools.cache
def guard_hydra_config() -> None:
    """``check_hydra_node`` on every config Hydra composes, before it is used (once per process)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    original = ConfigLoaderImpl.load_configuration

    @functools.wraps(original)
    def checked(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        _compact(check_hydra_node, config)
        _compact(check_composed, config)  # the folders Hydra is about to make (config.paths)
        return config

    ConfigLoaderImpl.load_configuration = checked
