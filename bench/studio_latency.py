"""Studio page load with 10k episodes in storage, in headless Debian chromium.

Builds a data folder holding one run of 10,000 episodes (RunWriter shards, 20 steps x 500),
starts the studio on it, and times page loads in a real browser: from navigation until the runs
table shows the run (``load_s``), and until a deep-linked episode's turns are drawn in the
inspector (``inspector_s``). The baseline is the same studio on an empty data folder, measured
in the same run. Target: load_s < 2 s. Prints one JSON object as the last line:

    python bench/studio_latency.py [--quick] [--episodes N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.record import add_record_flag, record  # noqa: E402
from envace_engine.types import (  # noqa: E402
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    Segment,
    ToolCall,
    ToolResult,
)
from storage.shards import RunWriter  # noqa: E402
from tests.browser import chromium_page, studio_server  # noqa: E402

RUN_ID = "bench-10k"
STEPS = 20


def make_episode(step: int, i: int) -> Episode:
    """A rehearsal-mode episode with one call: prompt, act, tool, act; one rehearsal."""
    call = ToolCall("get_stock", {"item": f"item{i % 7}"})
    ids = tuple(range(40))
    act = Segment(Role.ACT, ids[:12], '<tool_call>{"name": "get_stock"}</tool_call>', (-0.3,) * 12)
    return Episode(
        id=f"e{step}-{i}",
        task_id=f"task-{i % 50}",
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id=f"g{step}-{i // 4}",
        segments=(
            Segment(Role.PROMPT, ids, "system + user: how many?"),
            act,
            Segment(Role.TOOL, ids[:6], '{"qty": 3}'),
            Segment(Role.ACT, ids[:5], "There are 3.", (-0.2,) * 5),
        ),
        rehearsals=(
            Rehearsal(0, ids, Segment(Role.REHEARSE, ids[:8], '{"qty": 3}', (-0.1,) * 8), True),
        ),
        calls=(
            CallRecord(  # made by the first agent reply (step counts replies so far)
                0,
                1,
                call,
                "rehearsed",
                rehearsed=ToolResult({"qty": 3}),
                real=ToolResult({"qty": 3 + i % 2}),
            ),
        ),
        reward=float(i % 2),
    )


def build(root: Path, episodes: int) -> float:
    """Write ``episodes`` episodes in ``STEPS`` steps; returns seconds taken."""
    start = time.perf_counter()
    writer = RunWriter.create(root, "train", model="tiny", suite="toy", run_id=RUN_ID)
    per = max(1, episodes // STEPS)
    for step in range(STEPS):
        writer.episodes(step, [make_episode(step, i) for i in range(per)])
        writer.metrics(step, {"reward/act": 0.5, "loss": 1.0 / (step + 1)})
        writer.progress(step + 1, STEPS)
    writer.finish("done")
    return time.perf_counter() - start


def time_loads(url: str, repeats: int, needle: str, query: str = "") -> list[float]:
    """Seconds from navigation until ``needle`` is visible, one fresh page load each."""
    times = []
    with chromium_page() as page:
        for _ in range(repeats):
            start = time.perf_counter()
            page.goto(f"{url}/{query}")
            page.get_by_text(needle, exact=True).filter(visible=True).first.wait_for(timeout=60_000)
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    """Measure and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 loads per page")
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    add_record_flag(parser)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    os.environ["ENVACE_DEMO"] = "0"  # the empty baseline must really be empty
    with tempfile.TemporaryDirectory() as full, tempfile.TemporaryDirectory() as empty:
        build_s = build(Path(full), args.episodes)
        with studio_server(Path(empty)) as url:
            base = time_loads(url, repeats, "Launch a job", "?tab=runs")
        with studio_server(Path(full)) as url:
            loads = time_loads(url, repeats, RUN_ID, "?tab=runs")
            inspector = time_loads(
                url, repeats, "tool call 0: get_stock", "?tab=inspector&episode=e10-3"
            )
    load_s, base_s = statistics.median(loads), statistics.median(base)
    result = {
        "episodes": args.episodes,
        "repeats": repeats,
        "build_s": round(build_s, 2),
        "load_s": round(load_s, 3),
        "inspector_s": round(statistics.median(inspector), 3),
        "baseline_empty_load_s": round(base_s, 3),
        "ratio": round(load_s / base_s, 3),
        "target_load_s": 2.0,
        "loads": [round(t, 3) for t in loads],
    }
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
