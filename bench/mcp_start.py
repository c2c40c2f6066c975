"""Opening a batch's MCP sessions: one after another vs side by side (``rollout.loop.open_envs``).

Starts ``--sessions`` sessions of the example stdio server (``mcp:`` example suite) both ways,
``--repeats`` times, and closes each; reports the median wall seconds of each and their ratio.
Run it alone on the machine: it measures process start-up, which is CPU-bound. Prints one JSON
object:

    python bench/mcp_start.py [--sessions 8] [--repeats 3] [--record]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import add_record_flag, record  # noqa: E402
from envace_engine.environments import get_suite  # noqa: E402
from envace_engine.environments.base import close_env  # noqa: E402
from envace_engine.rollout.loop import open_envs  # noqa: E402

EXAMPLE = REPO / "envace_engine" / "environments" / "mcp" / "example" / "suite.toml"


def _timed(open_all: Callable[[], list[Any]]) -> float:
    started = time.perf_counter()
    envs = open_all()
    seconds = time.perf_counter() - started
    for env in envs:
        close_env(env)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    add_record_flag(parser)
    args = parser.parse_args()
    suite = get_suite(f"mcp:{EXAMPLE}")
    tasks = suite.tasks("train")[:1] * args.sessions
    serial, side = [], []
    for _ in range(args.repeats):
        serial.append(_timed(lambda: [suite.make_env(t) for t in tasks]))
        side.append(_timed(lambda: open_envs(suite, tasks) or []))
    result = {
        "sessions": args.sessions,
        "repeats": args.repeats,
        "one_after_another_s": round(statistics.median(serial), 3),
        "side_by_side_s": round(statistics.median(side), 3),
        "speedup": round(statistics.median(serial) / statistics.median(side), 2),
    }
    print(json.dumps(result))
    if args.record:
        record("mcp_start", result)


if __name__ == "__main__":
    main()
