"""A git revision's code in a temporary folder (``git archive``), for the A/B engine runs."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def export(revision: str) -> tuple[Path, str]:
    """(folder holding ``revision``'s tree, its short hash); the caller removes the folder."""
    short = subprocess.run(
        ["git", "rev-parse", "--short", revision],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if short.returncode != 0:
        raise SystemExit(f"--base {revision!r} is not a git revision here: {short.stderr.strip()}")
    tar = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True)
    folder = Path(tempfile.mkdtemp(prefix=f"envace-rev-{short.stdout.strip()}-"))
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as archive:
        archive.extractall(folder, filter="data")
    return folder, short.stdout.strip()
