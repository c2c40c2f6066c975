"""``--record``: append a bench script's final JSON object to ``bench/results/<script>.jsonl``.

Every bench script prints one JSON object as its last stdout line. With ``--record`` it also
appends that object, as one line, to ``bench/results/<script stem>.jsonl``, with three keys
added: ``recorded_at`` (UTC, ISO 8601), ``git_rev`` (``git rev-parse --short HEAD``, or
``"unknown"``) and ``host`` (CPU model and count). Results are kept there, not in the docs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def add_record_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--record`` to a bench script's command line."""
    parser.add_argument(
        "--record",
        action="store_true",
        help="also append the final JSON line to bench/results/<script>.jsonl",
    )


def record(script_name: str, result: dict[str, Any]) -> Path:
    """Append ``result`` plus when, at which revision and on what CPU; the file written.

    ``script_name`` is the script's stem or path (``"storage"``, ``__file__``).
    """
    line = {
        **result,
        "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        "host": host(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{Path(script_name).stem}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
    return path


def git_rev() -> str:
    """The checkout's short commit id, or ``"unknown"`` outside git."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def host() -> dict[str, Any]:
    """The CPU model (``/proc/cpuinfo``'s model name, else ``platform``'s) and the CPU count."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for entry in info:
                if entry.startswith("model name"):
                    cpu = entry.partition(":")[2].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu or platform.processor() or platform.machine() or "unknown",
        "cpu_count": os.cpu_count(),
    }
