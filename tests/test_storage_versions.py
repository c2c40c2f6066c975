"""Old data stays readable: one tiny run per schema version (tests/fixtures/schema/v*/), opened
through the storage API; unreadable runs are named with the reason; the one-address rule
(run, episode[, call]) for ids that repeat across runs; labels only on calls that exist."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from envace_engine.cli import app
from storage import SCHEMA_VERSION, RunWriter, Store
from storage.export import export_run, import_run
from storage.queries import AmbiguousEpisodeError
from storage.schema import ADDED_IN, CALLS, SCHEMA_HISTORY, TABLES
from storage.store import NOTE_MAX_CHARS
from storage.synthetic import make_step
from storage.upgrade import upgrade_run

FIXTURES = Path(__file__).parent / "fixtures" / "schema"
MEMORY = "duckdb:///:memory:"


def fixture_runs() -> dict[int, Path]:
    """{version: run folder} of the committed fixtures."""
    return {int(p.parent.name[1:]): p for p in sorted(FIXTURES.glob("v*/schema-v*"))}


def install(root: Path, *versions: int) -> Path:
    """Copy the fixture runs of ``versions`` into ``<root>/runs``."""
    for version in versions:
        src = fixture_runs()[version]
        shutil.copytree(src, root / "runs" / src.name)
    return root


def test_there_is_a_fixture_for_every_schema_version():
    assert sorted(fixture_runs()) == sorted(SCHEMA_HISTORY)
    for version, run in fixture_runs().items():
        assert json.loads((run / "run.json").read_text())["schema_version"] == version
        names = set(pq.read_schema(next((run / "calls").glob("*.parquet"))).names)
        later = {c for (table, c), v in ADDED_IN.items() if table == "calls" and v > version}
        assert not names & later  # the fixture really is that version's layout


@pytest.mark.parametrize("version", sorted(SCHEMA_HISTORY))
def test_each_version_opens_with_episodes_calls_pairs_and_curves(tmp_path, version):
    with Store(install(tmp_path, version), url=MEMORY) as store:
        run_id = f"schema-v{version}"
        runs = store.runs().set_index("run_id")
        assert runs.loc[run_id, "episodes"] > 0
        assert store.unreadable().empty
        episodes = store.episodes(run_id=run_id)
        view = store.episode(str(episodes["episode_id"].iloc[0]), run_id)
        assert not view.segments.empty and not view.calls.empty
        assert set(CALLS.names) - {"run_id", "step", "episode_id", "episode_index"} <= set(
            view.calls.columns
        )
        pairs = store.pairs(run_id=run_id)
        assert not pairs.empty and pairs["fidelity"].notna().all()
        assert not store.fidelity_by_tool(run_id).empty
        assert not store.curves(run_id).empty


def test_every_version_together_in_one_folder(tmp_path):
    with Store(install(tmp_path, *SCHEMA_HISTORY), url=MEMORY) as store:
        by_run = store.fidelity_by_run().set_index("run_id")["n"]
        assert {f"schema-v{v}" for v in SCHEMA_HISTORY} <= set(by_run.index)
        assert (by_run > 0).all()


def test_a_newer_run_is_named_with_the_reason_and_the_rest_still_opens(tmp_path):
    install(tmp_path, *SCHEMA_HISTORY)
    newer = tmp_path / "runs" / f"schema-v{SCHEMA_VERSION}"
    manifest = json.loads((newer / "run.json").read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    (newer / "run.json").write_text(json.dumps(manifest))
    with Store(tmp_path, url=MEMORY) as store:
        bad = store.unreadable()
        assert list(bad["run"]) == [newer.name]
        assert "newer than this build's" in bad["reason"].iloc[0]
        assert "schema-v1" in set(store.runs()["run_id"])
        assert newer.name not in set(store.runs()["run_id"])
    out = CliRunner().invoke(app, ["runs", "list", "--root", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "1 unreadable" in out.output and "newer than this build's" in out.output


def test_a_damaged_shard_is_named_and_the_rest_of_the_run_opens(tmp_path):
    install(tmp_path, SCHEMA_VERSION)
    run = tmp_path / "runs" / f"schema-v{SCHEMA_VERSION}"
    (run / "calls" / "step-000001.parquet").write_bytes(b"not parquet")
    with Store(tmp_path, url=MEMORY) as store:
        bad = store.unreadable()
        assert list(bad["run"]) == [run.name]
        assert "calls/step-000001.parquet" in bad["what"].iloc[0]
        assert not store.pairs(run_id=run.name, step=0).empty
    out = CliRunner().invoke(app, ["runs", "list", "--root", str(tmp_path)])
    assert "calls/step-000001.parquet" in out.output


def test_upgrade_adds_the_missing_columns_and_keeps_every_value(tmp_path):
    install(tmp_path, 1)
    run = tmp_path / "runs" / "schema-v1"
    before = {t: pq.read_table(s) for t in TABLES for s in sorted((run / t).glob("*.parquet"))}
    rewritten = upgrade_run(run)
    added = {table for (table, _), v in ADDED_IN.items() if v > 1}
    assert rewritten and {p.parent.name for p in rewritten} == added
    for table, old in before.items():
        new = pq.read_table(next((run / table).glob("*.parquet")))
        assert new.schema.names == TABLES[table].names
        assert new.select(old.column_names).to_pylist() == old.to_pylist()
    assert json.loads((run / "run.json").read_text())["schema_version"] == SCHEMA_VERSION
    assert upgrade_run(run) == []  # idempotent


def test_an_export_of_an_older_run_imports(tmp_path):
    install(tmp_path / "a", 1)
    export_run(tmp_path / "a" / "runs" / "schema-v1", tmp_path / "export")
    manifest = import_run(tmp_path / "export", tmp_path / "b", run_id="copy")
    with Store(tmp_path / "b", url=MEMORY) as store:
        assert manifest.run_id == "copy" and not store.pairs(run_id="copy").empty


@pytest.fixture
def twins(tmp_path):
    """Two runs whose episodes carry the same ids (same tag), one step each."""
    for run_id, n in (("twin-a", 4), ("twin-b", 2)):
        with RunWriter.create(tmp_path, "train", model="tiny", suite="toy", run_id=run_id) as w:
            w.episodes(0, make_step(0, n, "same"))
    with Store(tmp_path, url=MEMORY) as store:
        yield store


def test_an_id_in_two_runs_without_a_run_names_both(twins):
    episode_id = str(twins.episodes(run_id="twin-b")["episode_id"].iloc[0])
    with pytest.raises(AmbiguousEpisodeError, match="twin-a, twin-b"):
        twins.episode(episode_id)
    assert twins.episode(episode_id, "twin-b").episode["run_id"] == "twin-b"
    with pytest.raises(ValueError, match="twin-a, twin-b"):
        twins.annotate("episode", episode_id, "success")


def test_a_label_on_a_missing_call_is_refused_and_nothing_is_lost(twins):
    calls = twins.pairs(run_id="twin-a")
    call_id, episode_id = str(calls["call_id"].iloc[0]), str(calls["episode_id"].iloc[0])
    twins.annotate("call", call_id, "faithful", run_id="twin-a")
    for bad in (f"{episode_id}/99", f"{episode_id}/-1", f"{episode_id}/x"):
        with pytest.raises(KeyError, match="no call"):
            twins.annotate("call", bad, "faithful", run_id="twin-a")
    with pytest.raises(ValueError, match=f"at most {NOTE_MAX_CHARS}"):
        twins.annotate("call", call_id, "other", "x" * (NOTE_MAX_CHARS + 1), run_id="twin-a")
    kept = twins.annotations(run_id="twin-a")
    assert list(kept["target_id"]) == [call_id] and list(kept["label"]) == ["faithful"]


def test_the_queue_walks_its_own_run_when_ids_repeat(tmp_path):
    from storage.queue import QueueFilter

    # twin-a has 4 episodes, twin-b 2: the same first ids, at the same places
    for run_id, n in (("twin-a", 4), ("twin-b", 2)):
        with RunWriter.create(tmp_path, "train", model="tiny", suite="toy", run_id=run_id) as w:
            w.episodes(0, make_step(0, n, "same"))
    with Store(tmp_path, url=MEMORY) as store:
        b = QueueFilter(run_id="twin-b", author="me", scope="all")
        ids = []
        current = store.queue.next(b)
        while current is not None:
            ids.append(current)
            current = store.queue.next(b, current)
        assert ids == list(store.pairs(run_id="twin-b")["call_id"])
        with pytest.raises(KeyError, match="twin-b"):
            store.queue.next(b, "nope/0")
