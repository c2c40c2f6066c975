"""The bundled demo run: copied into an empty data folder on first start.

``scripts/make_demo_bundle.py`` fills ``studio/demo/bundle/`` with a slice of the reproduction
study's real runs (``scripts/make_demo_run.py``: one short training run). A studio that finds no
runs in its data folder copies the bundle in, so a fresh Space or laptop opens on the study's
report and real episodes. A folder that already holds runs is never touched, and a copied
demo is an ordinary run (the user may delete it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent / "demo" / "bundle"  # not "runs/": .gitignore


def install(root: Path, bundle: Path = BUNDLE) -> list[str]:
    """Copy every bundled run into ``<root>/runs`` if it holds no run yet; returns run ids."""
    runs = root / "runs"
    if not bundle.is_dir() or any(runs.glob("*/run.json")):
        return []
    installed = []
    for run in sorted(p for p in bundle.iterdir() if (p / "run.json").is_file()):
        target = runs / run.name
        tmp = runs / f".{run.name}.installing"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run, tmp)
        tmp.rename(target)  # whole run or nothing: the store never sees half a copy
        installed.append(run.name)
    return installed
