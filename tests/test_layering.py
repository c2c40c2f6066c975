"""The architecture's one-way dependency rule, checked on the source.

``studio → storage → envace_engine``: the engine (except its CLI, the composition root) never
imports storage, studio or gradio; storage never imports studio or gradio.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _modules(package: str, exclude: str | None = None) -> list[Path]:
    paths = sorted((ROOT / package).rglob("*.py"))
    return [p for p in paths if exclude is None or exclude not in p.parts]


@pytest.mark.parametrize("path", _modules("envace_engine", exclude="cli"), ids=str)
def test_engine_does_not_import_storage_or_ui(path):
    assert not _imported_roots(path) & {"storage", "studio", "gradio"}


@pytest.mark.parametrize("path", _modules("storage"), ids=str)
def test_storage_does_not_import_ui(path):
    assert not _imported_roots(path) & {"studio", "gradio"}
