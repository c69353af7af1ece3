"""Classes that declare their config options on the class, and the registry that finds such a
class by the ``_target_`` that names it.

- ``Declared``: a mixin for the classes of a ``_target_`` config group (data modules, models). Its
  ``Options`` is a frozen dataclass of ``fields.option`` fields, the options' one declaration (type,
  default, range or choices); ``read_options`` reads a node's options into it (``ValueError``
  naming ``<group>.<option>`` and the allowed values), ``bind_options`` the constructor's
  arguments (positional ones in the order of the fields, so calls written against a keyword
  signature keep working).
- ``Registry(package, base, noun)``: the ``Declared`` classes of a package, found by their class
  (no list of names): ``find(target)``, ``classes()``, ``required(node)`` and ``check(node)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from laplace_lab.io.fields import build


def plain(value: Any) -> Any:
    """``value`` with mappings as dicts and sequences as lists (Hydra hands list options over as
    ``ListConfig``), so ``fields.build`` sees the plain kinds."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [plain(v) for v in value]
    return value


def is_wiring(key: Any) -> bool:
    """Hydra's keys of a node (``_target_``, ``_partial_``, ...), not options of the object."""
    return str(key).startswith("_") and str(key).endswith("_")


class Declared:
    """A class whose options are declared on it (see the module docstring); ``option_group``
    names its config group in messages (``data``, ``model``)."""

    option_group: ClassVar[str] = ""

    @dataclass(frozen=True)
    class Options:
        """No options."""

    @classmethod
    def read_options(cls, options: Mapping[str, Any]) -> Any:
        """``cls.Options`` from a node's options (no ``_target_``); ``ValueError`` naming
        ``<group>.<option>`` and the allowed values for an unknown key, a wrong type or a bad value."""
        return build(cls.Options, plain(dict(options)), cls.option_group)

    @classmethod
    def bind_options(cls, args: tuple, options: Mapping[str, Any]) -> Any:
        """``read_options`` of a constructor's option arguments: ``args`` positional, in the order
        of ``Options``' fields; ``TypeError`` for too many or for one given twice (as Python's)."""
        names = [f.name for f in dataclasses.fields(cls.Options)]
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__}() takes {len(names)} option arguments ({names}); got {len(args)}")
        twice = sorted(set(names[:len(args)]) & set(options))
        if twice:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {twice[0]!r}")
        return cls.read_options({**dict(zip(names, args)), **options})


class Registry:
    """The subclasses of ``base`` defined in the modules of ``package``; the ``_target_`` of one is
    ``<package>.<Class>`` where the package exports it, else ``<package>.<module>.<Class>`` (a new
    file needs no export). ``noun`` names one in messages (``data module``, ``model``)."""

    def __init__(self, package: str, base: type[Declared], noun: str):
        self.package, self.base, self.noun = package, base, noun

    def target_of(self, cls: type) -> str:
        """The ``_target_`` that names ``cls``."""
        if getattr(importlib.import_module(self.package), cls.__name__, None) is cls:
            return f"{self.package}.{cls.__name__}"
        return f"{cls.__module__}.{cls.__qualname__}"

    def _member(self, obj: Any) -> bool:
        return (inspect.isclass(obj) and issubclass(obj, self.base) and obj is not self.base
                and obj.__module__.startswith(f"{self.package}."))

    def find(self, target: Any) -> type | None:
        """The class ``target`` names (``target_of`` of it, exactly), else ``None``. Only modules
        of the package are imported."""
        if not isinstance(target, str) or not target.startswith(f"{self.package}."):
            return None
        module, _, name = target.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), name, None)
        except ImportError:
            return None
        return obj if self._member(obj) and self.target_of(obj) == target else None

    def classes(self, where: Callable[[type], bool] = lambda cls: True) -> dict[str, type]:
        """``{target: class}`` of every class of the package for which ``where(cls)`` holds
        (imports every module of the package)."""
        package = importlib.import_module(self.package)
        found = {}
        for info in pkgutil.iter_modules(package.__path__, f"{self.package}."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if self._member(obj) and obj.__module__ == module.__name__ and where(obj):
                    found[self.target_of(obj)] = obj
        return dict(sorted(found.items()))

    def required(self, node: Mapping[str, Any]) -> type:
        """The class of a node whose ``_target_`` passed ``config.targets`` (``ValueError`` otherwise)."""
        cls = self.find(node.get("_target_"))
        if cls is None:
            group = self.base.option_group
            raise ValueError(f"{group}._target_={node.get('_target_')!r} is not a {self.noun}; "
                             f"allowed: {list(self.classes())}")
        return cls

    def check(self, node: Mapping[str, Any]) -> Any:
        """The options of a node (its keys other than Hydra's ``_x_``) read into its class's ``Options``."""
        return self.required(node).read_options({k: v for k, v in node.items() if not is_wiring(k)})
