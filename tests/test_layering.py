"""The architecture's one-way dependency rules, checked on the source (docs/architecture.md).

Across the three top-level packages: ``studio → storage → envace_engine``. The engine (except its
CLI, the composition root) never imports storage, studio or gradio; storage never imports studio
or gradio, and of the engine only the plain data types and the fidelity metrics.

Inside the engine, each layer may import only the layers below it:

    foundation (types, config, specs, models, adapters, tasks, sink, logprobs, seeds, stats)
      → environments, samplers        (side by side: neither imports the other)
      → rollout
      → fidelity
      → training, testtime            (side by side)
      → cli

Recipes (``recipes/``: the reproduction study) sit on top: they may import the engine and
storage, never the studio; nothing in the engine, storage or the studio imports a recipe.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "envace_engine"

FOUNDATION = "foundation"
# What each engine layer may import (besides itself and the standard library / third parties).
ALLOWED: dict[str, set[str]] = {
    FOUNDATION: set(),
    "environments": {FOUNDATION},
    "samplers": {FOUNDATION},
    "rollout": {FOUNDATION, "environments", "samplers"},
    "fidelity": {FOUNDATION},
    "training": {FOUNDATION, "environments", "samplers", "rollout", "fidelity"},
    "testtime": {FOUNDATION, "environments", "samplers", "rollout", "fidelity"},
    "cli": {
        FOUNDATION,
        "environments",
        "samplers",
        "rollout",
        "fidelity",
        "training",
        "testtime",
    },
}
# The engine modules storage may read: plain data and the pure rehearsed-vs-real comparison
# (the fidelity tiers, and the collusion instruments over stored calls).
STORAGE_MAY_IMPORT = {
    "envace_engine",  # only for the package's location (the fidelity helper's PYTHONPATH)
    "envace_engine.types",
    "envace_engine.fidelity.metrics",
    "envace_engine.fidelity.worker",
    "envace_engine.fidelity.collusion",
}


def _imports(path: Path) -> set[str]:
    """Every absolute module an import statement in ``path`` names (``from a.b import c`` also
    counts ``a.b.c``, which may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _roots(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imports(path)}


def _modules(package: str, exclude: str | None = None) -> list[Path]:
    paths = sorted((ROOT / package).rglob("*.py"))
    return [p for p in paths if exclude is None or exclude not in p.parts]


def layer_of_module(dotted: str) -> str | None:
    """The engine layer a module name belongs to (None: not an engine module or not a module)."""
    parts = dotted.split(".")
    if parts[0] != "envace_engine" or len(parts) == 1:
        return None
    head = parts[1]
    if head in ALLOWED:
        return head
    if (ENGINE / f"{head}.py").is_file():
        return FOUNDATION
    return None


def layer_of_path(path: Path) -> str:
    rel = path.relative_to(ENGINE)
    return rel.parts[0] if len(rel.parts) > 1 else FOUNDATION


@pytest.mark.parametrize("path", _modules("envace_engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_layers_import_only_lower_layers(path):
    own = layer_of_path(path)
    assert own in ALLOWED, f"{path}: new engine package {own!r}: add it to ALLOWED and the docs"
    used = {layer_of_module(name) for name in _imports(path)} - {None, own}
    assert used <= ALLOWED[own], f"{path} ({own}) imports {sorted(used - ALLOWED[own])}"


def test_every_engine_package_is_a_known_layer():
    packages = {p.name for p in ENGINE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ALLOWED) - {FOUNDATION}


@pytest.mark.parametrize("path", _modules("envace_engine", exclude="cli"), ids=str)
def test_engine_does_not_import_storage_or_ui(path):
    assert not _roots(path) & {"storage", "studio", "gradio"}


@pytest.mark.parametrize("path", _modules("recipes"), ids=str)
def test_recipes_use_the_engine_and_storage_not_the_studio(path):
    assert not _roots(path) & {"studio", "gradio"}


@pytest.mark.parametrize(
    "path", _modules("envace_engine") + _modules("storage") + _modules("studio"), ids=str
)
def test_nothing_below_imports_a_recipe(path):
    assert "recipes" not in _roots(path)


@pytest.mark.parametrize("path", _modules("storage"), ids=str)
def test_storage_does_not_import_ui(path):
    assert not _roots(path) & {"studio", "gradio"}


@pytest.mark.parametrize("path", _modules("storage"), ids=str)
def test_storage_reads_only_plain_engine_modules(path):
    engine = {n for n in _imports(path) if n.split(".")[0] == "envace_engine"}
    # ``from envace_engine.types import Episode`` also yields ``envace_engine.types.Episode``
    modules = {n for n in engine if layer_of_module(n) is None or _is_module(n)}
    assert modules <= STORAGE_MAY_IMPORT, sorted(modules - STORAGE_MAY_IMPORT)


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file()


# What ``envace --help`` and every command's module may not load at import: most imports sit at
# the top of their modules, and the ones inside functions keep these out of the CLI's start.
CLI_NEVER_LOADS = ("torch", "transformers", "trl", "peft", "duckdb", "sqlmodel", "mcp", "uvicorn")


def test_the_cli_starts_without_loading_the_heavy_packages():
    code = (
        "import sys, envace_engine.cli\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({CLI_NEVER_LOADS!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
