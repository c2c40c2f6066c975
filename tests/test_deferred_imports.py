"""An import inside a function has one reason to be there: deferring a heavy load.

Readers and tools follow a module's data flow from the imports at its top, so an import inside a
function must pay for itself: it defers a heavy third-party package (``HEAVY``), or an internal
module that loads one when imported (found here by following module-level imports), or it breaks
an import cycle listed in ``CYCLES`` with its reason. Anything else belongs at the top
(docs/architecture.md).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.test_layering import CLI_NEVER_LOADS  # what the CLI's start may not load

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envace_engine", "storage", "studio", "recipes")

SOURCES = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]

# Third-party packages whose import costs a noticeable start-up (or pulls a server stack): the
# ones the CLI's start may not load, and more; the CLI, the studio's pages and the tests import
# the modules that use them without paying for them.
HEAVY = frozenset(CLI_NEVER_LOADS) | {
    "accelerate",
    "safetensors",
    "tokenizers",
    "datasets",
    "huggingface_hub",
    "pyarrow",
    "numpy",
    "sqlalchemy",
    "gradio",
    "altair",
    "pandas",
    "trackio",
    "sglang",
    "bfcl_eval",
    "playwright",
}
# (file, imported module) -> why the import cannot sit at the top.
CYCLES: dict[tuple[str, str], str] = {
    ("studio/pages/annotate.py", "studio.pages"): "queue imports annotate",
    ("recipes/study/claims.py", "recipes.study.report"): "report imports claims",
    ("recipes/study/cli.py", "envace_engine.cli.train"): "the CLI loads the study plugin",
}


def module_file(name: str) -> Path | None:
    """The source file of internal module ``name`` (a package's ``__init__.py``), if any."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    """The modules an ``ImportFrom`` loads: the base, and each name that is itself a module."""
    if node.level:
        parts = here.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    subs = [f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}")]
    return [base, *subs]


def imported(node: ast.Import | ast.ImportFrom, path: Path) -> list[str]:
    """Absolute names of the modules one import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return _absolute(node, module_name(path), path.name == "__init__.py")


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test or node)


def top_level_imports(path: Path) -> list[str]:
    """Modules ``path`` loads when imported: module-level imports, outside TYPE_CHECKING blocks
    and outside functions and classes' methods."""
    found: list[str] = []
    todo: list[ast.AST] = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += imported(node, path)
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.ClassDef) and not _type_checking(
            node
        ):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
    return found


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: importing a module runs its packages' inits."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@cache
def _heavy_modules() -> frozenset[str]:
    """Internal modules whose import loads a ``HEAVY`` package, directly or through others (a
    fixpoint over the module-level import graph, so cycles need no special care)."""
    deps = {module_name(p): top_level_imports(p) for p in SOURCES}
    heavy: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, imports in deps.items():
            if name not in heavy and any(_heavy(i, heavy) for i in imports):
                heavy.add(name)
                changed = True
    return frozenset(heavy)


def _heavy(name: str, heavy: set[str] | frozenset[str]) -> bool:
    return name.split(".")[0] in HEAVY or any(m in heavy for m in _with_parents(name))


def loads_heavy(name: str) -> bool:
    """Whether importing ``name`` loads a ``HEAVY`` package, directly or through internal ones."""
    return _heavy(name, _heavy_modules())


def deferred_imports(path: Path) -> list[list[str]]:
    """The import statements inside functions of ``path``, each as the modules it loads."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    found.append(imported(inner, path))
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_import_inside_a_function_defers_a_heavy_load_or_a_listed_cycle(path):
    rel = str(path.relative_to(ROOT))
    needless = [
        names[0]
        for names in deferred_imports(path)
        if not any(loads_heavy(n) for n in names) and (rel, names[0]) not in CYCLES
    ]
    assert not needless, f"{rel}: move these imports to the top of the module: {needless}"


def test_every_listed_cycle_is_still_deferred():
    for (rel, name), why in CYCLES.items():
        firsts = [names[0] for names in deferred_imports(ROOT / rel)]
        assert name in firsts, f"{rel} no longer defers {name} ({why}): drop it from CYCLES"


def test_the_analysis_sees_through_internal_modules():
    """Checks of the checker: the storage layer loads DuckDB, the plain types load nothing heavy,
    and a relative import resolves against its package."""
    assert loads_heavy("storage.store")
    assert not loads_heavy("envace_engine.types")
    node = ast.parse("from .shards import RunWriter").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert imported(node, ROOT / "storage" / "store.py")[0] == "storage.shards"
