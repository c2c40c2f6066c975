"""Two processes, one data folder: a job appending shards while the studio queries, and a crash.

Both tests start a real writer process (``RunWriter`` in a ``python -c`` subprocess) next to a
real ``Store`` in this process; nothing is simulated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from storage import Store

WRITER = textwrap.dedent(
    """
    import sys, time
    from dataclasses import replace
    from storage import RunWriter
    from storage.synthetic import make_step

    root, steps, per_step, tokens, pause = sys.argv[1], *map(float, sys.argv[2:])
    steps, per_step, tokens = int(steps), int(per_step), int(tokens)
    template = make_step(0, min(per_step, 50), "w", tokens=tokens)
    writer = RunWriter.create(root, "rollout", model="tiny", suite="toy", run_id="live")
    for step in range(steps):
        eps = [replace(template[i % len(template)], id=f"s{step}-e{i}") for i in range(per_step)]
        print("writing", step, flush=True)
        writer.episodes(step, eps)
        writer.metrics(step, {"reward/mean": step / steps})
        writer.progress(step + 1, steps)
        time.sleep(pause)
    writer.finish()
    print("finished", flush=True)
    """
)


def start_writer(root: Path, steps: int, per_step: int, tokens: int, pause: float):
    """The writer subprocess; run from the repo root so ``storage`` imports."""
    repo = Path(__file__).resolve().parents[1]
    args = [sys.executable, "-c", WRITER, str(root), str(steps), str(per_step), str(tokens)]
    return subprocess.Popen(
        [*args, str(pause)], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow  # 1000 queries: ~25 s alone, longer on a shared machine
def test_studio_queries_while_a_job_appends(tmp_path):
    writer = start_writer(tmp_path, steps=40, per_step=8, tokens=16, pause=0.02)
    errors: list[str] = []
    counts: list[int] = []
    with Store(tmp_path, url="duckdb:///:memory:") as store:
        for i in range(1000):
            try:
                kind = i % 5
                if kind == 0:
                    n = store.count_episodes(run_id="live")
                    assert n % 8 == 0, f"saw {n} episodes: a partial step"
                    counts.append(n)
                elif kind == 1:
                    page = store.episodes(run_id="live", limit=20, offset=max(0, i // 50))
                    if not page.empty:  # every listed episode has its turns on disk
                        view = store.episode(page["episode_id"].iloc[-1])
                        assert len(view.segments) == 8 and len(view.calls) == 3
                elif kind == 2:
                    store.pairs(run_id="live", tool="ls", limit=20)
                elif kind == 3:
                    store.curves("live")
                    store.fidelity_by_tool("live")
                else:
                    store.runs()
            except Exception as err:  # the test's point: count any failure, never stop early
                errors.append(f"query {i}: {type(err).__name__}: {err}")
        writer_alive_at_end = writer.poll() is None
        out, err = writer.communicate(timeout=120)
        final = store.count_episodes(run_id="live")
    assert writer.returncode == 0, err
    assert errors == []
    assert counts == sorted(counts), "episode counts went backwards"
    assert len(set(counts)) > 1 or writer_alive_at_end, "queries never overlapped the writes"
    assert final == 40 * 8 and "finished" in out


@pytest.mark.slow  # builds a 16k-turn step to kill the writer inside it
def test_kill_during_a_shard_write_leaves_earlier_steps_intact(tmp_path):
    # steps 0-1 small; step 2 large (2000 episodes x 8 turns x 256 tokens) so we can hit it.
    writer = start_writer(tmp_path, steps=3, per_step=2000, tokens=256, pause=0.0)
    run = tmp_path / "runs" / "live"
    deadline = time.monotonic() + 300
    victim = None
    while victim is None and time.monotonic() < deadline:
        if (run / "metrics" / "step-000001.parquet").exists():
            victim = next(iter(run.glob("*/.step-000002.parquet.tmp-*")), None)
        if writer.poll() is not None:
            break
        time.sleep(0.001)
    assert victim is not None, "never caught the writer mid-shard"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    assert not (run / "episodes" / "step-000002.parquet").exists()
    for shard in run.glob("*/*.parquet"):  # every visible shard is complete and readable
        pq.read_table(shard)
    with Store(tmp_path, url="duckdb:///:memory:") as store:
        assert store.count_episodes(run_id="live") == 2 * 2000
        assert sorted(store.episodes(run_id="live", limit=10_000)["step"].unique()) == [0, 1]
        last = store.episode("s1-e1999")
        assert len(last.segments) == 8 and len(last.rehearsals) == 3
        assert list(store.curves("live")["step"]) == [0, 1]
    assert list(run.glob("*/.*.tmp-*")), "the interrupted temporary file should still be there"
