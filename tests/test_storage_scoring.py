"""storage.scoring: text similarities in a real helper process give the numbers computed here.

Every test starts a real ``python -m envace_engine.fidelity.worker`` process; failures are real
too (the helper is killed, or a step fails before reading its answer).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow.parquet as pq

import envace_engine
from envace_engine.fidelity.metrics import similarities
from storage import RunWriter
from storage.rows import step_tables
from storage.scoring import SimilarityHelper, _child_env
from storage.synthetic import make_step

PAIRS = [('{"a":1}', '{"a":2}'), ('{"b":[1,2]}', '{"b":[2,1]}'), ("[1,2,3]", "[3]")]


def ready(helper: SimilarityHelper, timeout: float = 60.0) -> None:
    """Submit until the helper has started and answered (its start is never waited for)."""
    deadline = time.monotonic() + timeout
    while helper.used == 0:
        assert time.monotonic() < deadline, "the helper never answered"
        helper.submit(PAIRS)()
        time.sleep(0.05)


def test_helper_answers_with_the_numbers_computed_here():
    helper = SimilarityHelper(min_pairs=1)
    try:
        assert list(helper.submit(PAIRS)()) == similarities(PAIRS)  # not started yet: here
        ready(helper)
        used = helper.used
        many = [(f'{{"n":{i}}}', f'{{"n":{i % 7},"m":1}}') for i in range(500)]
        assert list(helper.submit(many)()) == similarities(many)
        assert helper.used == used + 1
    finally:
        helper.close()
    assert helper._proc is None


def test_small_steps_never_start_a_helper():
    helper = SimilarityHelper(min_pairs=10)
    assert list(helper.submit(PAIRS)()) == similarities(PAIRS)
    assert helper._proc is None


def test_a_killed_helper_falls_back_and_a_dropped_answer_is_skipped():
    helper = SimilarityHelper(min_pairs=1)
    try:
        ready(helper)
        helper.submit(PAIRS)  # a step that failed before reading its answer
        swapped = [(b, a) for a, b in PAIRS]
        assert list(helper.submit(swapped)()) == similarities(swapped)  # not the stale answer
        assert helper.failures == 0
        assert helper._proc is not None
        helper._proc.kill()
        helper._proc.wait()
        assert list(helper.submit(PAIRS)()) == similarities(PAIRS)  # computed here instead
        assert helper.failures == 1
    finally:
        helper.close()


def test_run_writer_with_the_helper_writes_the_same_tables(tmp_path):
    episodes = make_step(0, 40, "r")
    writer = RunWriter.create(tmp_path, "rollout", run_id="r")
    writer._similarity.min_pairs = 1
    ready(writer._similarity)
    used = writer._similarity.used
    writer.episodes(0, episodes)
    assert writer._similarity.used == used + 1
    writer.finish()
    assert writer._similarity._proc is None  # finish stops the helper
    expected = step_tables("r", 0, episodes)
    for name in ("calls", "episodes"):
        table = pq.read_table(tmp_path / "runs" / "r" / name / "step-000000.parquet")
        assert table.equals(expected[name].replace_schema_metadata(table.schema.metadata)), name


def test_the_helper_imports_the_code_this_process_imported(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    root = str(Path(envace_engine.__file__).resolve().parents[1])
    assert _child_env()["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]


def test_a_forked_child_does_not_keep_the_helper_alive():
    helper = SimilarityHelper(min_pairs=1)
    ready(helper)
    proc = helper._proc
    child = os.fork()
    if child == 0:  # the child holds no copy of the helper's pipes: it only waits
        time.sleep(20)
        os._exit(0)
    try:
        helper.close()  # the helper sees end-of-input and exits by itself (not killed)
        assert proc.returncode == 0
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
