"""Typed config fields: each declares its type, default and allowed values once (``option``), and
``build`` reads a plain mapping into a frozen dataclass of them, raising ``ValueError`` with the
option's dotted name and the allowed values for an unknown key, a wrong type or a value out of range.

Messages (kept as the project has always printed them):

- ``<name> is not a known option of the <group> group; allowed: [...]``
- ``<name>=<value> has the wrong type: got a str; allowed: a number``
- ``<name> must be >= 1 or null; got 0 (allowed: integers in [1, inf))``
- ``<name>=<value> is not supported; allowed: [...]``
- ``<name> must be true or false; got <value>``
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

INF = math.inf
REQUIRED = "???"  # OmegaConf's missing value: the option files of the group must set it
TYPE_NAMES = {"bool": "bool", "int": "number", "float": "number", "str": "str", "list": "list", "dict": "dict"}


@dataclass(frozen=True)
class Spec:
    """What one option accepts.

    ``kind``: ``bool`` | ``int`` | ``float`` (ints accepted) | ``str`` | ``list`` | ``dict`` | ``any``;
    ``low``/``high`` (``low_open``: ``> low``; ``high_open``: ``< high``), ``nullable``, ``choices`` (a
    list's: of each entry); ``items``: the kind of a list's entries (``int`` | ``float`` (ints accepted) |
    ``str``), numbers each within ``low``/``high``; ``nonempty``: a list needs at least one entry;
    ``indexed``: a list's entry out of range is named ``<name>[i]`` (default: ``<name> entries``);
    ``describe``: shown after the name (``" (the learning rate)"``);
    ``options``: the group options whose config file carries the key (None: all of them, see
    ``config.store``); ``message``: a fixed message for a bad value (``{name}`` and ``{value}``);
    ``accepts``: a predicate for what the kinds cannot state (``any`` of a union, e.g. ``trainer.devices``),
    with ``message`` naming the allowed values.
    """

    kind: str
    low: float | None = None
    high: float = INF
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    choices: tuple | None = None
    items: str | None = None
    nonempty: bool = False
    indexed: bool = False
    describe: str = ""
    options: tuple[str, ...] | None = None
    message: str | None = None
    accepts: Callable[[Any], bool] | None = None


def option(default: Any, kind: str, **spec: Any) -> Any:
    """A dataclass field with a default and a ``Spec``; list and dict defaults are copied per instance."""
    meta = {"spec": Spec(kind, **spec)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: _copy(default), metadata=meta)
    return field(default=default, metadata=meta)


def group(cls: type, **spec: Any) -> Any:
    """A nested dataclass field (a sub-node, e.g. ``marglik.linear_mode``)."""
    return field(default_factory=cls, metadata={"group": cls, "spec": Spec("dict", **spec)})


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # a config node holds lists
        return [_copy(v) for v in value]
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def type_name(value: Any) -> str | None:
    """``bool`` | ``number`` | ``str`` | ``list`` | ``dict`` of a value; None for null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "dict"
    return type(value).__name__


def _fail(message: str) -> None:
    raise ValueError(message)


def check(name: str, value: Any, spec: Spec) -> Any:
    """``value`` if ``spec`` accepts it, else ``ValueError`` naming ``name`` (the dotted option)."""
    if value is None:
        if spec.nullable or spec.kind == "any":
            return None
    if spec.message is not None and not _accepts(value, spec):
        _fail(spec.message.format(name=name, value=value))
    if spec.kind == "bool":
        if not isinstance(value, bool):  # (a group's option names its type; a root option says true or false)
            _fail(f"{name}={value!r} has the wrong type: got a {type_name(value)}; allowed: a bool" if "." in name
                  else f"{name} must be true or false; got {value!r}")
        return value
    if spec.kind in ("int", "float"):
        _check_number(name, value, spec)
        return value
    if spec.kind == "any":
        if spec.accepts is not None and not spec.accepts(value):
            _fail((spec.message or "{name}={value!r} is not supported").format(name=name, value=value))
        return value
    got = type_name(value)
    if got != TYPE_NAMES[spec.kind]:
        _fail(f"{name}={value!r} has the wrong type: got a {got}; allowed: a {TYPE_NAMES[spec.kind]}"
              + (" (write a list as [a, b], not as a string)" if spec.kind == "list" else ""))
    for entry in value if spec.kind == "list" else (value,):  # a list's choices: of each entry
        if spec.choices is not None and entry not in spec.choices:
            _fail(f"{name}={entry!r} is not supported; allowed: {list(spec.choices)}")
    if spec.kind == "list":
        _check_entries(name, value, spec)
    return value


ENTRY_NAMES = {"int": "integers", "float": "numbers", "str": "strings"}


def _check_entries(name: str, value: list, spec: Spec) -> None:
    """A list option's entries: their count, kind and (numbers) range."""
    if spec.nonempty and not value:
        _fail(f"{name}=[] must not be empty; allowed: a list of one or more {ENTRY_NAMES.get(spec.items, 'entries')}")
    if spec.items is None:
        return
    is_kind = {"int": lambda e: isinstance(e, int) and not isinstance(e, bool), "float": _is_number,
               "str": lambda e: isinstance(e, str)}[spec.items]
    bad = [e for e in value if not is_kind(e)]
    if bad:
        _fail(f"{name}={list(value)!r} must be a list of {ENTRY_NAMES[spec.items]}; got entries {bad}")
    if spec.items != "str":
        entry = Spec(spec.items, low=spec.low, high=spec.high, low_open=spec.low_open, high_open=spec.high_open)
        for i, e in enumerate(value):
            _check_number(f"{name}[{i}]" if spec.indexed else f"{name} entries", e, entry)


def _accepts(value: Any, spec: Spec) -> bool:
    try:
        check("", value, dataclasses.replace(spec, message=None))
    except ValueError:
        return False
    return True


def _check_number(name: str, value: Any, spec: Spec) -> None:
    if not _is_number(value):
        _fail(f"{name}={value!r} has the wrong type: got a {type_name(value)}; allowed: a number")
    low = -INF if spec.low is None else spec.low
    ok = (spec.kind == "float" or isinstance(value, int)) and (value < spec.high if spec.high_open else value <= spec.high)
    if not (ok and (value > low if spec.low_open else value >= low)):
        below = "<" if spec.high_open else "<="
        bounds = ("> " if spec.low_open else ">= ") + _num(low) + ("" if spec.high == INF else f" and {below} {_num(spec.high)}")
        interval = (("(" if spec.low_open else "[") + f"{_num(low)}, "
                    + ("inf)" if spec.high == INF else f"{_num(spec.high)}{')' if spec.high_open else ']'}"))
        what = "integers" if spec.kind == "int" else "numbers"
        _fail(f"{name}{spec.describe} must be {bounds}{' or null' if spec.nullable else ''}; got {value!r} "
              f"(allowed: {what} in {interval})")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) != INF else str(x)


def build(cls: type, data: Mapping | None, path: str, extra_keys=()) -> Any:
    """``cls`` (a dataclass of ``option`` / ``group`` fields) from ``data``; missing keys take their
    defaults. ``path`` is the dotted name of the node (``marglik``, ``marglik.linear_mode``; ``""``:
    the root config), whose first part names the group in messages; ``extra_keys`` are further keys
    the caller reads itself (left out of the dataclass)."""
    data = {} if data is None else data
    where = f"the {path.split('.')[0]} group" if path else "the root config"
    if not isinstance(data, Mapping):
        _fail(f"{path} must be a mapping; got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if "spec" in f.metadata}
    known = set(fields) | set(extra_keys)
    for key in data:
        if key not in known:
            _fail(f"{key} is not a known root option; allowed: {sorted(known)}" if not path else
                  f"{_join(path, key)} is not a known option of {where}; allowed: {sorted(known)}")
    values = {}
    for name, f in fields.items():
        if data.get(name, f.default) == REQUIRED:
            _fail(f"{_join(path, name)} is required (every option of {where} sets it)")
        if name not in data:
            continue
        if "group" in f.metadata:
            values[name] = build(f.metadata["group"], data[name], _join(path, name))
        else:
            values[name] = check(_join(path, name), data[name], f.metadata["spec"])
    return cls(**values)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def defaults(cls: type, option_name: str | None = None) -> dict[str, Any]:
    """The defaults of ``cls`` as a plain dict: the config node that a group option starts from
    (only the fields whose ``Spec.options`` include ``option_name``, when given)."""
    out = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("spec")
        if spec is None:  # not a config key (e.g. a structure's options, collected by the loader)
            continue
        if option_name is not None and spec is not None and spec.options is not None and option_name not in spec.options:
            continue
        if "group" in f.metadata:
            out[f.name] = defaults(f.metadata["group"])
        else:
            out[f.name] = _copy(f.default_factory() if f.default is dataclasses.MISSING else f.default)
    return out
