"""Studio latency with many episodes in storage, in headless Debian chromium.

Builds a data folder holding one run of ``--episodes`` episodes (RunWriter shards, 20 steps) and
a second run of 1,000 (for the comparison), starts the studio on it, and times in a real
browser, each from the user's action until the answer is drawn:

* ``load_s``: navigation until the runs table shows the run;
* ``inspector_s``: a deep-linked episode until its turns are drawn;
* ``queue_next_s``: *Skip* on the annotation queue (deep-linked mid-run) until the next pair;
* ``search_s``: *Search* for a phrase in the big run until the hits are listed;
* ``compare_runs_s``: a deep-linked two-run comparison until its task table is drawn;
* ``compare_metric_s``: switching that comparison's curve until the new chart is drawn;
* ``pairs_s``: the *Rehearsed vs real* page, opened on the big run, until its first pairs show;
* ``annotate_link_s``: a deep link to one pair of the annotation queue until it is shown.

The baseline is the same studio on an empty data folder, measured in the same run. Targets at
1M episodes: every median <= 1 s, queue_next_s <= 0.5 s (``targets`` in the JSON). Prints one
JSON object as the last line:

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

RUN_ID = "bench-big"
ANSWERS = {False: "There are 3.", True: "There are 3 (checked twice)."}  # a rare phrase
OTHER = "bench-small"
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
            Segment(Role.ACT, ids[:5], ANSWERS[i % 997 == 0], (-0.2,) * 5),
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


def build(root: Path, episodes: int, run_id: str = RUN_ID) -> float:
    """Write ``episodes`` episodes in ``STEPS`` steps; returns seconds taken."""
    start = time.perf_counter()
    writer = RunWriter.create(root, "train", model="tiny", suite="toy", run_id=run_id)
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


def time_actions(page: object, repeats: int, act: object, done: object) -> list[float]:
    """Seconds from ``act(page, i)`` until ``done(page, i)`` returns, ``repeats`` times."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        act(page, i)  # type: ignore[operator]
        done(page, i)  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return times


def time_queue(url: str, repeats: int, episodes: int) -> list[float]:
    """Skip through the annotation queue, deep-linked to a pair in the middle of the run."""
    per = max(1, episodes // STEPS)
    middle = f"e{STEPS // 2}-{per // 2}/0"
    with chromium_page() as page:
        page.goto(f"{url}/?tab=annotate&run={RUN_ID}&call={middle}")
        head = page.locator("#queue-head")
        head.get_by_text(middle, exact=True).wait_for(timeout=120_000)
        shown = [middle]

        def act(p: object, i: int) -> None:
            shown.append(head.inner_text())
            page.locator("#queue-skip").click()

        def done(p: object, i: int) -> None:
            page.wait_for_function(
                "t => document.querySelector('#queue-head').innerText !== t",
                arg=shown[-1],
                timeout=120_000,
            )

        return time_actions(page, repeats, act, done)


def time_search(url: str, repeats: int) -> list[float]:
    """Search the big run, alternating a phrase in every episode with one in 1 of 997: the
    hit counts differ, so each search's answer is a new message to wait for."""
    phrases = ("There are 3", "checked twice")
    with chromium_page() as page:
        page.goto(f"{url}/?tab=inspector&run={RUN_ID}")
        page.locator("#episode-list").get_by_text("e0-0", exact=True).first.wait_for(
            timeout=120_000
        )
        box = page.locator("#insp-search textarea, #insp-search input").first
        message = page.locator("#insp-search-message")
        before: list[str] = []

        def act(p: object, i: int) -> None:
            box.fill(phrases[i % 2])
            before.append(message.inner_text())
            page.locator("#insp-search-go").click()

        def done(p: object, i: int) -> None:
            page.wait_for_function(
                "t => { const m = document.querySelector('#insp-search-message').innerText;"
                " return m !== t && m.includes('match'); }",
                arg=before[-1],
                timeout=120_000,
            )

        return time_actions(page, 2 * repeats, act, done)


def time_metric_switch(url: str, repeats: int) -> list[float]:
    """Switch the two-run comparison's curve back and forth until the chart is redrawn."""
    from tests.studio_browser import choose

    metrics = ("loss", "reward/act")
    with chromium_page() as page:
        page.goto(f"{url}/?tab=runs-compare&runs={RUN_ID},{OTHER}")
        page.locator("#cmp-plot .vega-embed").first.wait_for(timeout=120_000)
        before: list[str] = []

        # vega draws on a canvas: its pixels, not the page's HTML, show the new chart
        pixels = "() => { const c = document.querySelector('#cmp-plot canvas');"
        pixels += " return c ? c.toDataURL() : ''; }"

        def act(p: object, i: int) -> None:
            before.append(page.evaluate(pixels))
            shown = page.locator("#cmp-metric input").first.input_value()
            choose(page, "cmp-metric", next(m for m in metrics if m != shown))

        def done(p: object, i: int) -> None:
            page.wait_for_function(
                f"t => ({pixels})() !== t && ({pixels})() !== ''",
                arg=before[-1],
                timeout=120_000,
            )

        return time_actions(page, repeats, act, done)


TARGETS = {
    "load_s": 1.0,
    "inspector_s": 1.0,
    "queue_next_s": 0.5,
    "search_s": 1.0,
    "compare_runs_s": 1.0,
    "compare_metric_s": 1.0,
    "pairs_s": 1.0,
    "annotate_link_s": 1.0,
}


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
        build(Path(full), 1000, OTHER)
        with studio_server(Path(empty)) as url:
            base = time_loads(url, repeats, "Launch a job", "?tab=runs")
        with studio_server(Path(full), timeout_s=600) as url:
            loads = time_loads(url, repeats, RUN_ID, "?tab=runs")
            inspector = time_loads(
                url, repeats, "tool call 0: get_stock", f"?tab=inspector&run={RUN_ID}&episode=e10-3"
            )
            queue = time_queue(url, repeats, args.episodes)
            search = time_search(url, repeats)
            compare = time_loads(url, repeats, "task-0", f"?tab=runs-compare&runs={RUN_ID},{OTHER}")
            switch = time_metric_switch(url, repeats)
            pairs = time_loads(url, repeats, "e0-0/0", f"?tab=compare&run={RUN_ID}")
            middle = f"e{STEPS // 2}-{max(1, args.episodes // STEPS) // 2}/0"
            annotate = time_loads(url, repeats, middle, f"?tab=annotate&run={RUN_ID}&call={middle}")
    load_s, base_s = statistics.median(loads), statistics.median(base)
    medians = {
        "load_s": load_s,
        "inspector_s": statistics.median(inspector),
        "queue_next_s": statistics.median(queue),
        "search_s": statistics.median(search),
        "compare_runs_s": statistics.median(compare),
        "compare_metric_s": statistics.median(switch),
        "pairs_s": statistics.median(pairs),
        "annotate_link_s": statistics.median(annotate),
    }
    result = {
        "episodes": args.episodes,
        "repeats": repeats,
        "build_s": round(build_s, 2),
        **{name: round(value, 3) for name, value in medians.items()},
        "baseline_empty_load_s": round(base_s, 3),
        "ratio": round(load_s / base_s, 3),
        "targets": TARGETS,
        "over_target": sorted(n for n, v in medians.items() if v > TARGETS[n]),
        "loads": [round(t, 3) for t in loads],
    }
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
