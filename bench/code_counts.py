"""Code-structure counts that issue [J] (one job spec, one composition root) reports before and
after: lines of the CLI and of the config code, the parameters of the largest command
functions, and imports inside functions (engine, storage, studio). Prints one JSON object:

    python bench/code_counts.py [--record]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import add_record_flag, record  # noqa: E402

PACKAGES = ("envace_engine", "storage", "studio", "recipes")
CONFIG_FILES = (
    "envace_engine/config.py",
    "envace_engine/specs.py",
    "recipes/study/config.py",
)


def line_count(paths: list[Path]) -> int:
    """Lines in ``paths`` (blank and comment lines included, as a reader meets them)."""
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)


def command_parameters(paths: list[Path]) -> list[tuple[str, int]]:
    """(module:function, parameter count) of every top-level function in the CLI modules,
    largest first: the command functions are the ones a job spec would replace."""
    found = []
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef):
                count = len(node.args.args) + len(node.args.kwonlyargs)
                found.append((f"{path.stem}:{node.name}", count))
    return sorted(found, key=lambda item: -item[1])


def imports_in_functions(path: Path) -> int:
    """Import statements inside any function of ``path`` (each counted once)."""
    inner: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner |= {id(n) for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)}
    return len(inner)


def counts(root: Path) -> dict[str, object]:
    """Every count, for the tree at ``root``."""
    # the engine's commands and the recipes' (``envace study`` lives in recipes/study/cli.py)
    cli = sorted((root / "envace_engine" / "cli").rglob("*.py"))
    cli += sorted((root / "recipes").glob("*/cli.py"))
    sources = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    inner = {str(p.relative_to(root)): imports_in_functions(p) for p in sources}
    largest = command_parameters(cli)[:5]
    return {
        "cli_lines": line_count(cli),
        "config_lines": line_count([root / f for f in CONFIG_FILES if (root / f).is_file()]),
        "largest_commands": {name: n for name, n in largest},
        "imports_in_functions": sum(inner.values()),
        "files_with_imports_in_functions": sum(1 for n in inner.values() if n),
    }


def main() -> None:
    """Count this checkout and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_flag(parser)
    args = parser.parse_args()
    result = counts(REPO)
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
