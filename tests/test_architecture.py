"""The package's layers: each module imports only from its own package or the layers below it, and
no chain of imports leads back to where it started (``import_circle``).

The check parses every module of ``src/laplace_lab`` (imports inside functions included) and runs in
the default test run, so CI repeats it: ``pytest -q tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "laplace_lab"
# From the entry point down; packages in one row are independent of each other.
LAYERS = [
    ("laplace_lab.train", "laplace_lab.plan"),  # the entry points (plan: a run's Laplace plan, untrained)
    ("laplace_lab.reporting",),
    ("laplace_lab.training",),
    ("laplace_lab.sweeps",),
    ("laplace_lab.config",),
    ("laplace_lab.evaluation", "laplace_lab.data", "laplace_lab.models"),
    ("laplace_lab.laplace",),
    ("laplace_lab.io",),  # pure Python helpers (io.fields: declared options), under the engine too
]
LAYER_OF = {name: depth for depth, row in enumerate(LAYERS) for name in row}
# The engine is pure PyTorch: usable and testable without these.
ENGINE_FORBIDDEN = ("pytorch_lightning", "lightning", "hydra", "omegaconf")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run_at_import(node: ast.AST):
    """The nodes under ``node`` that run when the module is imported: not the bodies of functions and
    lambdas, nor ``if TYPE_CHECKING:`` blocks (class bodies do run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for orelse in child.orelse for n in [orelse, *run_at_import(orelse)])
            continue
        yield child
        yield from run_at_import(child)


def imported_modules(path: Path, name: str | None = None, at_import: bool = False) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of ``path``, the module ``name`` (relative imports resolved;
    ``from m import a`` gives ``m`` and ``m.a``, since ``a`` may be a submodule); ``at_import``: only
    the imports that run when the module is imported (``run_at_import``)."""
    name, is_package = name or module_name(path), path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in (run_at_import(tree) if at_import else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                module = ".".join(base[:len(base) - node.level + 1] + ([module] if module else []))
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def layer(module: str) -> str | None:
    """The entry of ``LAYERS`` that ``module`` belongs to (None: the package init, or outside)."""
    head = ".".join(module.split(".")[:2])
    return head if head in LAYER_OF else None


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_package_has_a_layer():
    tops = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert {f"laplace_lab.{t}" for t in tops - {"__init__"}} == set(LAYER_OF)


def test_only_the_entry_points_and_the_init_are_loose_modules():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "plan.py", "train.py"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_from_a_higher_layer(path):
    own = layer(module_name(path))
    if own is None:
        return
    bad = []
    for line, module in imported_modules(path):
        other = layer(module)
        if other is None or other == own:
            continue
        if LAYER_OF[other] <= LAYER_OF[own]:  # above, or a sibling of the same row
            bad.append(f"line {line}: {module} ({other} is not below {own})")
    assert not bad, f"{module_name(path)} imports upward or sideways:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", sorted((PACKAGE / "laplace").rglob("*.py")) + sorted((PACKAGE / "io").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_engine_imports_neither_lightning_nor_hydra(path):
    """The engine and the layer below it (``io``, which the engine imports)."""
    bad = [f"line {line}: {m}" for line, m in imported_modules(path) if m.split(".")[0] in ENGINE_FORBIDDEN]
    assert not bad, f"{module_name(path)}: " + ", ".join(bad)


def test_the_check_finds_an_upward_import(tmp_path):
    """The parser sees an import inside a function, and a relative one."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from laplace_lab.train import build\n    from .. import train\n")
    found = [m for _, m in imported_modules(module, "laplace_lab.training.m")]
    assert found == ["laplace_lab.train", "laplace_lab.train.build", "laplace_lab", "laplace_lab.train"]
    assert layer("laplace_lab.train.build") == "laplace_lab.train" and layer("laplace_lab") is None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``module -> the modules of `modules` it imports when it is imported``. The packages above a
    module are no edges of it: Python loads them first, so they are in ``sys.modules`` already
    (``from laplace_lab.training import fit`` inside ``training`` is an edge to ``training.fit`` only)."""
    graph = {}
    for name, path in modules.items():
        above = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {m for _, m in imported_modules(path, name, at_import=True)
                       if m in modules and m != name and m not in above}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` as ``[a, b, ..., a]``; ``[]`` if it has none (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return []


def test_no_import_circle():
    """No chain of module-level imports leads back to where it started (imports inside functions,
    which run later, are not counted): a circle breaks as soon as one side runs code at import."""
    graph = import_graph({module_name(p): p for p in MODULES})
    circle = import_circle(graph)
    assert not circle, "import circle: " + " -> ".join(circle)


# Imports inside functions that may close a circle (they run after both modules are loaded), as
# (importer, imported): the reason the shared piece cannot move down. None today.
LAZY_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {}


def test_no_import_circle_through_lazy_imports_either():
    """Counting the imports inside functions too: a lazy import that closes a circle hides a shared
    piece that belongs lower (``training.fit`` once imported ``map_grid.validation_nll`` lazily)."""
    modules = {module_name(p): p for p in MODULES}
    graph = {name: {m for _, m in imported_modules(path, name) if m in modules and m != name
                    and not name.startswith(m + ".") and (name, m) not in LAZY_IMPORTS_ALLOWED}
             for name, path in modules.items()}
    circle = import_circle(graph)
    assert not circle, "import circle (counting imports inside functions): " + " -> ".join(circle)


def test_the_circle_check_finds_a_circle(tmp_path):
    """Two modules that import each other at module level are a circle; a lazy import is not."""
    (tmp_path / "a.py").write_text("from laplace_lab.x.b import f\n")
    (tmp_path / "b.py").write_text("import laplace_lab.x.a\nf = 1\n")
    (tmp_path / "c.py").write_text("def g():\n    from laplace_lab.x.a import f\n")
    modules = {f"laplace_lab.x.{n}": tmp_path / f"{n}.py" for n in "abc"}
    graph = import_graph(modules)
    assert graph == {"laplace_lab.x.a": {"laplace_lab.x.b"}, "laplace_lab.x.b": {"laplace_lab.x.a"},
                     "laplace_lab.x.c": set()}
    assert import_circle(graph) == ["laplace_lab.x.a", "laplace_lab.x.b", "laplace_lab.x.a"]
    assert import_circle({**graph, "laplace_lab.x.b": set()}) == []


# Where the composed config (Hydra's ``DictConfig``) may appear: the entry point, the config package
# that reads it into the typed ``RunConfig``, and the Hydra callbacks (sweep summary, sweep ETA),
# which Hydra hands its own config.
DICTCONFIG_ALLOWED = ("train.py", "config/", "sweeps/callback.py", "sweeps/sweep_eta.py")


def test_only_the_entry_point_and_config_see_the_composed_config():
    """``grep -rn DictConfig src/`` finds it only where ``DICTCONFIG_ALLOWED`` says."""
    found = [str(p.relative_to(PACKAGE)) for p in MODULES if "DictConfig" in p.read_text()]
    assert found and all(f.startswith(DICTCONFIG_ALLOWED) for f in found), found


# The widest signature allowed outside the engine (``laplace/``, whose API follows laplace-torch's):
# more arguments go into a small frozen dataclass of what belongs together (``TableSpec``,
# ``MAPOptimisation``, ...).
MAX_PARAMETERS = 8


def wide_functions(path: Path, limit: int = MAX_PARAMETERS) -> list[str]:
    """``"<line> <name>: <n> parameters"`` for every function or method of ``path`` with more than
    ``limit`` parameters: positional, keyword-only, ``*args`` and ``**kwargs`` each count one; a
    method's ``self`` / ``cls`` does not."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args)]
        n = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
        n -= bool(names) and names[0] in ("self", "cls")
        if n > limit:
            found.append((node.lineno, f"{node.lineno} {node.name}: {n} parameters"))
    return [text for _, text in sorted(found)]


def test_no_function_outside_the_engine_takes_more_than_eight_parameters():
    wide = [f"{p.relative_to(PACKAGE)}:{w}" for p in MODULES if not p.is_relative_to(PACKAGE / "laplace")
            for w in wide_functions(p)]
    assert not wide, (f"functions with more than {MAX_PARAMETERS} parameters (group what belongs together "
                      "into a frozen dataclass):\n" + "\n".join(wide))


def test_the_width_check_counts_every_kind_of_parameter_but_self(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class C:\n    def m(self, a, b, c, d, e, f, g, h): ...\n"
                      "    def n(self, a, b, c, d, e, f, g, *, h, i): ...\n"
                      "def f(a, b, /, c, d, e, f, *args, g, **kwargs): ...\n")
    assert wide_functions(module) == ["3 n: 9 parameters", "4 f: 9 parameters"]
