"""Comments, docstrings and docs that name a place of the code name one that exists.

Three kinds of pointer are checked, in the docstrings and ``#`` comments of the Python files and in
the Markdown and yaml files (``SOURCES``):

- a full name ``laplace_lab.<module>[.<name>[.<attribute>]]``: the module exists and defines the name
  (a class's attribute: set in the class);
- a short name ``<module>.<name>`` whose head is a module of the package (``training.fit.train_map``,
  ``map_grid.validation_nll``): some module of that name defines it. Heads that are also config keys
  (``data.n_val``, ``map_cache.dir``) or a variable of the file itself (``fused.begin()``) are skipped;
- a repository path (``src/...``, ``tests/...``, ``docs/...``, ``benchmarks/...``, ``conf/...``,
  ``experiments/...``, ``results/...``, or ``../`` relative to the file): the file exists.

``ALLOWED`` lists the pointers into other repositories that look like ours, with the reason.
Statics only (regular expressions; ``ast`` for the modules pointed at; nothing imported).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "laplace_lab"
SOURCES = sorted({*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
                  *(ROOT / "experiments").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md",
                  ROOT / "benchmarks" / "README.md", *(ROOT / "experiments").rglob("README.md"),
                  *(ROOT / "conf").rglob("*.yaml")})
REPO_TOPS = ("src/", "tests/", "docs/", "benchmarks/", "conf/", "experiments/", "results/")
# (file relative to the root, pointer): pointers into another repository, with the reason.
ALLOWED = {
    # the commands run laplace-torch's own test suite inside its checkout
    **{("docs/laplace_torch_compat.md", f"tests/test_{n}.py"): "laplace-torch's tests"
       for n in ("baselaplace", "laplace", "lllaplace", "serialization")},
    ("benchmarks/e2e_peer.py", "laplace.marglik_training"): "laplace-torch's package is named laplace",
    ("tests/experiments/test_marglik_authors_uci_peer.py", "laplace.curvature"): "laplace-torch's, in a script",
    ("tests/test_doc_references.py", "instantiate.call_target"): "the stale pointer the self-test plants",
}
FULL_NAME = re.compile(r"\blaplace_lab(?:\.[A-Za-z_]\w*)+")
SHORT_NAME = re.compile(r"(?<![\w./-])([a-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w.]*/)(?!\.\w)")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:\.\./)*(?:[\w.-]+/)+[\w.-]+\.(?:py|yaml|md))\b")
FILE_SUFFIXES = {"py", "json", "md", "yaml", "csv", "npy", "npz", "html", "txt", "pt", "ckpt", "log", "png", "pdf",
                 "gz", "jsonl", "yml", "toml", "sh"}


def _module_path(dotted: str) -> Path | None:
    path = SRC.joinpath(*dotted.split("."))
    return path / "__init__.py" if (path / "__init__.py").exists() else (
        path.with_suffix(".py") if path.with_suffix(".py").exists() else None)


def _modules_by_last_name() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found.setdefault(parts[-1], []).append(".".join(parts))
    return found


MODULES = _modules_by_last_name()


def _config_keys() -> set[str]:
    """Every key of the composed config's yaml files and every annotated field of a module that
    declares options (``fields.option``)."""
    keys: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            keys.update(str(k) for k in node)
            for v in node.values():
                walk(v)

    for path in (ROOT / "conf").rglob("*.yaml"):
        walk(yaml.safe_load(path.read_text()))
    for path in PACKAGE.rglob("*.py"):  # the schema's dataclasses and the classes that declare options
        if "option(" not in path.read_text():
            continue
        keys.update(n.target.id for n in ast.walk(_tree(path)) if isinstance(n, ast.AnnAssign)
                    and isinstance(n.target, ast.Name))
    return keys


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """``name -> statement`` for what a module or class body defines (also under ``if`` / ``try``)."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            out.update(_defined(node.body + getattr(node, "orelse", [])
                                + [s for h in getattr(node, "handlers", []) for s in h.body]))
    return out


@cache
def resolves(dotted: str) -> bool:
    """A full dotted name names a module, then a name the module defines, then a class attribute."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_path(".".join(parts[:i]))
        if path is not None:
            return _defines(path, parts[i:])
    return False


def _defines(path: Path, rest: list[str]) -> bool:
    if not rest:
        return True
    node = _defined(_tree(path).body).get(rest[0])
    if node is None:  # a lazy attribute of a package (PEP 562 ``__getattr__``)
        text = path.read_text()
        return "__getattr__" in text and (f'"{rest[0]}"' in text or f"'{rest[0]}'" in text)
    if len(rest) == 1:
        return True
    if isinstance(node, ast.ClassDef):  # a method, a class attribute, or set on self; inherited: not checked
        return (rest[1] in _defined(node.body) or bool(node.bases)
                or any(isinstance(n, ast.Attribute) and n.attr == rest[1] for n in ast.walk(node)))
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("laplace_lab"):
        return resolves(f"{node.module}.{'.'.join(rest)}")
    return True  # an attribute of a value: not checked


DOCSTRING = re.compile(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', re.S)
COMMENT = re.compile(r"#.*")


def _prose(path: Path) -> tuple[str, set[str]]:
    """The text to check (a Python file: its triple-quoted strings and comments) and the names the
    file binds itself (assigned, parameters, loop and ``as`` names), which are not module pointers."""
    text = path.read_text()
    if path.suffix != ".py":
        return text, set()
    strings = ["".join(m) for m in DOCSTRING.findall(text)]
    comments = COMMENT.findall(DOCSTRING.sub("", text))
    code = COMMENT.sub("", DOCSTRING.sub("", text))
    bound = set(re.findall(r"(?<![\w.])([a-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", code))  # x = / x: T = / f(x=
    bound |= set(re.findall(r"\b(?:for|as)\s+([a-z_]\w*)", code))
    bound |= set(re.findall(r"[(,]\s*\*{0,2}([a-z_]\w*)\s*(?=[,):])", code))  # parameters, tuple items
    return "\n".join(strings + comments), bound


def stale_pointers(path: Path, config_keys: set[str], as_file: Path | None = None) -> list[str]:
    """The pointers of ``path`` (read as the file ``as_file`` of the repository, default ``path``) that
    name nothing."""
    text, variables = _prose(path)
    bad = [m for m in set(FULL_NAME.findall(text)) if not resolves(m)]
    for name in set(SHORT_NAME.findall(text)):
        head, last = name.split(".")[0], name.rsplit(".", 1)[1]
        if head not in MODULES or head in config_keys or head in variables or last in FILE_SUFFIXES:
            continue
        if not any(resolves(module + name[len(head):]) for module in MODULES[head]):
            bad.append(name)
    for pointer in set(REPO_PATH.findall(text)):
        if pointer.startswith("../"):
            exists = ((as_file or path).parent / pointer).resolve().exists()
        elif pointer.startswith(REPO_TOPS):
            exists = (ROOT / pointer).exists()
        else:
            continue
        if not exists:
            bad.append(pointer)
    rel = str((as_file or path).relative_to(ROOT))
    return sorted({b for b in bad if (rel, b) not in ALLOWED})


CONFIG_KEYS = _config_keys()


def test_pointers_in_comments_and_docs_exist():
    """One test over all ``SOURCES`` (a second or two; per-file cases would cost more in pytest)."""
    bad = {str(p.relative_to(ROOT)): found for p in SOURCES if (found := stale_pointers(p, CONFIG_KEYS))}
    assert not bad, "pointers to places that do not exist:\n" + "\n".join(f"{p}: {b}" for p, b in bad.items())


def test_the_check_finds_stale_pointers(tmp_path):
    """A moved function, a missing module, a missing file: each is found; existing ones are not."""
    quotes = '"' * 3
    module = tmp_path / "probe.py"
    module.write_text(f"{quotes}``training.fit.no_such_function``, ``laplace_lab.no_such_module``,\n"
                      "``training.fit.train_map``, ``laplace_lab.training.fit.train_map``, docs/no_such_page.md,\n"
                      f"docs/architecture.md, ``data.n_val`` (a config key).{quotes}\n"
                      "# ``instantiate.call_target`` was removed\n")
    assert stale_pointers(module, CONFIG_KEYS, ROOT / "tests" / "probe.py") == [
        "docs/no_such_page.md", "instantiate.call_target", "laplace_lab.no_such_module",
        "training.fit.no_such_function"]
