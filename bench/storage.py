"""Storage benchmark: bulk Parquet ingest vs SQLModel row-by-row inserts, and inspector latency.

One run, in a temporary folder that is deleted afterwards:

1. bulk ingest — ``RunWriter.episodes`` (Episode objects -> Arrow -> zstd Parquet, atomic
   rename; every (rehearsed, real) pair scored) for every step; turns/s per step (a turn is one
   ``segments`` row), median reported, per second of wall time, of process CPU time (both
   threads) and of the calling thread's CPU time (the Python half, which bounds the wall rate
   when a second core takes the encoding); plus ``import_run`` of a Parquet export of the same
   run (flat rows -> per-step shards of every table), the bulk path with no Python objects;
2. baseline — the same segment rows inserted one by one through a SQLModel session into a
   DuckDB table (``session.add`` + ``flush`` per row, one commit), on a smaller sample;
3. inspector queries through ``Store`` at the full size (1M turns by default): the episode
   list page with filters, its count, one episode's turns, the pairs page, and free-text search;
   p50/p95 in milliseconds.

The last stdout line is one JSON object; ``ratio`` = bulk turns/s over row-by-row turns/s.
Targets (ISSUE [S]): bulk >= 100k turns/s; list/episode/pairs p95 < 100 ms at 1M turns.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine
from sqlmodel import Field, Session, SQLModel

from bench.record import add_record_flag, record
from envace_engine.types import Episode
from storage import RunWriter, Store
from storage.export import export_run, import_run
from storage.synthetic import make_step

SEGMENTS_PER_EPISODE = 8  # make_step with calls=3: prompt + 3 x (act, tool) + final act


class SegmentRow(SQLModel, table=True):
    """The baseline's table: one row per turn, tokens as JSON text."""

    __tablename__ = "bench_segments"

    row_id: str = Field(primary_key=True)
    run_id: str
    step: int
    episode_id: str
    seq: int
    role: str
    text: str
    token_ids: str
    logprobs: str | None = None


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def restamp(template: list[Episode], step: int) -> list[Episode]:
    """The template step's episodes with ids unique to ``step`` (generation is not measured)."""
    return [
        replace(ep, id=f"s{step:04d}-{ep.id}", group_id=f"s{step}-{ep.group_id}") for ep in template
    ]


def bulk_ingest(root: Path, turns: int, per_step: int) -> tuple[dict[str, list[float]], list[str]]:
    """Write ``turns`` turns with RunWriter: turns/s per step (wall, process CPU, this thread's
    CPU) and sample episode ids."""
    writer = RunWriter.create(root, "rollout", model="synthetic", suite="toy", run_id="bench")
    template = make_step(0, per_step, "bench")
    steps = max(1, turns // (per_step * SEGMENTS_PER_EPISODE))
    rates: dict[str, list[float]] = {"wall": [], "cpu": [], "thread": []}
    ids: list[str] = []
    for step in range(steps):
        episodes = restamp(template, step)
        n = sum(len(e.segments) for e in episodes)
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        writer.episodes(step, episodes)
        rates["wall"].append(n / (time.perf_counter() - t0))
        rates["cpu"].append(n / (time.process_time() - c0))
        rates["thread"].append(n / (time.thread_time() - h0))
        ids.extend(e.id for e in episodes[:: max(1, per_step // 20)])
        writer.metrics(step, {"reward/mean": step / steps})
    writer.finish()
    return rates, ids


def import_ingest(root: Path, turns: int) -> tuple[float, float]:
    """Turns/s (wall, CPU) of ``import_run`` of a Parquet export: bulk ingest of flat rows."""
    export = root / "export"
    export_run(root / "runs" / "bench", export, "parquet")
    t0, c0 = time.perf_counter(), time.process_time()
    import_run(export, root / "imported")
    return turns / (time.perf_counter() - t0), turns / (time.process_time() - c0)


def rowwise_ingest(sample_episodes: int) -> float:
    """Turns/s inserting segment rows one by one through SQLModel into DuckDB (in memory)."""
    engine = create_engine("duckdb:///:memory:")
    # SQLAlchemy sets __table__ on a table=True class; sqlmodel's types do not declare it.
    SQLModel.metadata.create_all(engine, tables=[SegmentRow.__table__])  # type: ignore[attr-defined]
    episodes = make_step(0, sample_episodes, "base")
    n = 0
    t0 = time.perf_counter()
    with Session(engine) as session:
        for ep in episodes:
            for seq, seg in enumerate(ep.segments):
                session.add(
                    SegmentRow(
                        row_id=f"{ep.id}/{seq}",
                        run_id="base",
                        step=0,
                        episode_id=ep.id,
                        seq=seq,
                        role=str(seg.role),
                        text=seg.text,
                        token_ids=json.dumps(seg.token_ids),
                        logprobs=None if seg.logprobs is None else json.dumps(seg.logprobs),
                    )
                )
                session.flush()
                n += 1
        session.commit()
    return n / (time.perf_counter() - t0)


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """p50/p95 wall latency of ``fn`` in ms (after one warm-up call), and p50/p95 CPU time.

    CPU time (all threads of this process) is reported too because the 2-core machines are
    shared: under load, wall time mostly measures waiting for a core.
    """
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return {
        "p50_ms": round(statistics.median(wall), 2),
        "p95_ms": round(percentile(wall, 0.95), 2),
        "cpu_p50_ms": round(statistics.median(cpu), 2),
        "cpu_p95_ms": round(percentile(cpu, 0.95), 2),
    }


def query_latency(root: Path, ids: list[str], total_episodes: int, repeats: int) -> dict[str, Any]:
    """Latency of the inspector's queries on the written run."""
    rng = random.Random(0)
    with Store(root, url="duckdb:///:memory:") as store:
        pages = max(1, total_episodes // 4 // 50)
        filters = {"run_id": "bench", "stop_reason": "done", "reward_max": 0.5}
        return {
            "episode_list_page": timed(
                lambda: store.episodes(limit=50, offset=50 * rng.randrange(pages), **filters),
                repeats,
            ),
            "episode_count": timed(lambda: store.count_episodes(**filters), repeats),
            "episode_turns": timed(lambda: store.episode(rng.choice(ids)), repeats),
            "pairs_page": timed(
                lambda: store.pairs(
                    run_id="bench", tool="ls", limit=50, offset=50 * rng.randrange(pages)
                ),
                repeats,
            ),
            "text_search_page": timed(
                lambda: store.episodes(run_id="bench", text=f"final answer {rng.randrange(999)}"),
                max(5, repeats // 4),
            ),
        }


def main() -> None:
    """Run the benchmark and print one JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="120k turns, fewer repeats (<1 min)")
    parser.add_argument("--turns", type=int, default=None, help="turns to ingest (default 1M)")
    add_record_flag(parser)
    args = parser.parse_args()
    turns = args.turns or (120_000 if args.quick else 1_000_000)
    per_step = 2_000 if args.quick else 5_000
    repeats = 15 if args.quick else 50
    root = Path(tempfile.mkdtemp(prefix="envace-bench-storage-"))
    try:
        rates, ids = bulk_ingest(root, turns, per_step)
        written = len(rates["wall"]) * per_step * SEGMENTS_PER_EPISODE
        size_mb = sum(p.stat().st_size for p in (root / "runs").rglob("*.parquet")) / 2**20
        imported, imported_cpu = import_ingest(root, written)
        baseline = rowwise_ingest(25 if args.quick else 250)
        bulk = statistics.median(rates["wall"])
        queries = query_latency(root, ids, written // SEGMENTS_PER_EPISODE, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    inspector = ("episode_list_page", "episode_turns", "pairs_page")
    result = {
        "bench": "storage",
        "quick": args.quick,
        "turns": written,
        "episodes": written // SEGMENTS_PER_EPISODE,
        "parquet_mb": round(size_mb, 1),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "bulk_turns_per_s": round(bulk),
        "bulk_turns_per_cpu_s": round(statistics.median(rates["cpu"])),
        "bulk_turns_per_thread_cpu_s": round(statistics.median(rates["thread"])),
        "import_turns_per_s": round(imported),
        "import_turns_per_cpu_s": round(imported_cpu),
        "rowwise_turns_per_s": round(baseline),
        "ratio": round(bulk / baseline, 1),
        "queries": queries,
        "inspector_max_p95_ms": max(queries[q]["p95_ms"] for q in inspector),
        "targets_met": bulk >= 100_000 and all(queries[q]["p95_ms"] < 100 for q in inspector),
    }
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
