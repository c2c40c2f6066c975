"""Store: run discovery, the query verbs with filters and pages, labels, jobs, schema checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

from storage import SCHEMA_VERSION, RunWriter, SchemaVersionError, Store, StoreLockedError
from storage.synthetic import make_step

MEMORY = "duckdb:///:memory:"


@pytest.fixture
def root(tmp_path):
    """Two runs: r1 with 2 steps x 8 episodes (+ metrics), r2 with 1 step x 4 episodes."""
    with RunWriter.create(tmp_path, "train", model="tiny", suite="toy", run_id="r1") as w:
        for step in range(2):
            w.episodes(step, make_step(step, 8, "r1"))
            w.metrics(step, {"loss": 1.0 / (step + 1), "reward/mean": step / 2})
            w.progress(step + 1, 2)
    with RunWriter.create(tmp_path, "eval", model="tiny", suite="bfcl", run_id="r2") as w:
        w.episodes(0, make_step(0, 4, "r2"))
    return tmp_path


@pytest.fixture
def store(root):
    with Store(root, url=MEMORY) as s:
        yield s


def test_empty_root_answers_every_query(tmp_path):
    with Store(tmp_path, url=MEMORY) as s:
        assert s.runs().empty
        assert s.episodes().empty and s.count_episodes() == 0
        assert s.pairs().empty and s.curves("x").empty
        assert s.fidelity_by_tool("x").empty


def test_runs_lists_manifest_progress_and_aggregates(store):
    runs = store.runs().set_index("run_id")
    assert set(runs.index) == {"r1", "r2"}
    assert runs.loc["r1", "steps"] == 2 and runs.loc["r1", "episodes"] == 16
    assert runs.loc["r1", "status"] == "done" and runs.loc["r1", "done"] == 2
    # synthetic rewards are (seed % 5) / 4 for seeds 0..15
    assert runs.loc["r1", "mean_reward"] == pytest.approx(sum(s % 5 for s in range(16)) / 4 / 16)
    info = store.run("r1")
    assert info.manifest.kind == "train" and info.progress.total == 2
    with pytest.raises(KeyError, match="known: r1, r2"):
        store.run("nope")


def test_new_run_appears_without_reopening(store, root):
    store.runs()
    RunWriter.create(root, "demo", run_id="r3").episodes(0, make_step(0, 2, "r3"))
    assert "r3" in set(store.runs()["run_id"])
    assert store.count_episodes(run_id="r3") == 2


def test_curves(store):
    curves = store.curves("r1")
    assert list(curves["name"]) == ["loss", "loss", "reward/mean", "reward/mean"]
    assert list(curves["value"]) == [1.0, 0.5, 0.0, 0.5]
    wide = store.sweep_results("r1")
    assert list(wide["loss"]) == [1.0, 0.5]


def test_episode_filters_and_pages(store):
    assert store.count_episodes() == 20
    assert store.count_episodes(run_id="r1", step=1) == 8
    assert store.count_episodes(suite="toy") == 20  # both runs use the toy generator
    assert store.count_episodes(run_id="r1", reward_min=0.5, reward_max=0.75) == 6
    assert store.count_episodes(run_id="r1", stop_reason="turn_limit") == 4
    assert store.count_episodes(task="task-000") == 8  # seeds 0-3 of each step and run
    assert store.count_episodes(text="FINAL ANSWER 13") == 1
    assert store.count_episodes(role="rehearse", text="<execution_result>2") == 20
    assert store.count_episodes(fidelity_min=0.99) == 0  # every episode has a wrong rehearsal
    page1 = store.episodes(run_id="r1", limit=5)
    page2 = store.episodes(run_id="r1", limit=5, offset=5)
    assert list(page1["episode_index"]) == [0, 1, 2, 3, 4]
    assert list(page2["episode_index"]) == [5, 6, 7, 0, 1]
    assert list(page2["step"]) == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="limit >= 1"):
        store.episodes(limit=0)
    with pytest.raises(TypeError):
        store.episodes(colour="red")


def test_episode_view_and_next_failure(store):
    view = store.episode("r1-ep0000009")
    assert view.episode["step"] == 1 and view.episode["task_id"] == "task-002"
    assert list(view.segments["seq"]) == list(range(8))
    assert list(view.segments["role"]) == ["prompt"] + ["act", "tool"] * 3 + ["act"]
    assert len(view.calls) == 3 and list(view.rehearsals["call_index"]) == [0, 1, 2]
    assert view.advantages == {"act": -1.0, "rehearse": 0.5}
    with pytest.raises(KeyError):
        store.episode("missing")
    # reward is (seed % 5) / 4: seed 0 fails, seed 4 succeeds, seed 5 fails again
    assert store.next_failure("r1") == "r1-ep0000000"
    assert store.next_failure("r1", "r1-ep0000003") == "r1-ep0000005"  # seed 4 has reward 1.0
    assert store.next_failure("r1", "r1-ep0000015") is None


def test_pairs_and_aggregates(store):
    pairs = store.pairs(run_id="r1", limit=1000)
    assert len(pairs) == 48  # 16 episodes x 3 rehearsed calls
    assert set(pairs["real_status"]) == {"ok"}
    assert store.pairs(run_id="r1", fidelity_min=1.0, limit=1000)["exact"].all()
    page = store.pairs(run_id="r1", limit=5, offset=5)
    assert list(page["call_id"]) == list(pairs["call_id"][5:10])
    assert list(pairs["call_id"][:3]) == ["r1-ep0000000/0", "r1-ep0000000/1", "r1-ep0000000/2"]
    assert store.pairs(run_id="r1", status="error").empty
    assert set(store.pairs(tool="ls", limit=1000)["tool"]) == {"ls"}
    by_tool = store.fidelity_by_tool("r1")
    assert by_tool["n"].sum() == 48 and list(by_tool["tool"]) == sorted(by_tool["tool"])
    confusion = store.status_confusion("r1").set_index("predicted_status")["n"]
    assert confusion["error"] + confusion["ok"] == 48
    assert confusion["error"] == sum(1 for s in range(16) for k in range(3) if (s + k) % 3 == 2)
    steps = store.fidelity_over_steps("r1")
    assert list(steps["step"]) == [0, 1]
    assert list(store.fidelity_by_status("r1")["real_status"]) == ["ok"]
    by_run = store.fidelity_by_run().set_index("run_id")
    assert list(by_run["n"]) == [48, 12]
    assert by_run.loc["r1", "mean_fidelity"] == pytest.approx(pairs["fidelity"].mean())
    assert by_run.loc["r1", "exact"] == pytest.approx(pairs["exact"].mean())


def test_annotation_history_is_never_overwritten(store):
    first = store.annotate("call", "r1-ep0000002/1", "wrong-number", "5% off", "alice")
    second = store.annotate("call", "r1-ep0000002/1", "fine", "on second look", "bob")
    store.annotate("episode", "r1-ep0000002", "interesting", author="carol")
    history = store.annotations(target_id="r1-ep0000002/1")
    assert list(history["annotation_id"]) == [second, first]  # newest first, both kept
    assert list(history["label"]) == ["fine", "wrong-number"]
    assert set(history["run_id"]) == {"r1"}
    pair = store.pairs(run_id="r1", limit=1000).set_index("call_id").loc["r1-ep0000002/1"]
    assert pair["label"] == "fine"  # the current label is the newest
    assert store.count_episodes(label="fine") == 1
    assert store.count_episodes(label="wrong-number") == 0
    assert store.episodes(label="interesting")["label"].tolist() == ["interesting"]
    exported = store.export_labels("r1")
    assert len(exported) == 3 and exported["is_current"].sum() == 2
    with pytest.raises(ValueError, match="target_kind"):
        store.annotate("run", "r1", "x")
    with pytest.raises(KeyError, match="no episode"):
        store.annotate("episode", "nope", "x")


def test_labels_belong_to_one_run_when_episode_ids_repeat(tmp_path):
    """Two runs whose episode ids coincide (each run counts from 0): a label stays in its run."""
    for run_id in ("a", "b"):
        with RunWriter.create(tmp_path, "eval", model="tiny", suite="toy", run_id=run_id) as w:
            w.episodes(0, make_step(0, 4, "same"))
    with Store(tmp_path, url=MEMORY) as store:
        with pytest.raises(ValueError, match=r"in 2 runs \(a, b\)"):
            store.annotate("call", "same-ep0000001/0", "faithful", author="ana")
        with pytest.raises(KeyError, match="in run 'c'"):
            store.annotate("call", "same-ep0000001/0", "faithful", author="ana", run_id="c")
        store.annotate("call", "same-ep0000001/0", "faithful", author="ana", run_id="b")
        store.annotate("episode", "same-ep0000001", "success", author="ana", run_id="b")
        labels = {r: store.pairs(run_id=r, limit=100).set_index("call_id")["label"] for r in "ab"}
        assert labels["b"]["same-ep0000001/0"] == "faithful"
        assert labels["a"].isna().all()  # run a's call of the same id is unlabelled
        assert store.count_episodes(run_id="a", label="success") == 0
        assert store.count_episodes(run_id="b", label="success") == 1
        assert store.episode("same-ep0000001", "a").labels.empty
        assert list(store.episode("same-ep0000001", "b").labels["run_id"]) == ["b", "b"]
        assert set(store.export_labels()["run_id"]) == {"b"}


def test_jobs_and_budgets(store):
    store.add_job("j1", "train", "r1", "envace train", 123, "running")
    store.update_job("j1", status="done", exit_code=0)
    job = store.jobs().iloc[0]
    assert (job["status"], job["exit_code"], job["pid"]) == ("done", 0, 123)
    with pytest.raises(ValueError, match="cannot set"):
        store.update_job("j1", colour="red")
    with pytest.raises(KeyError):
        store.update_job("nope", status="done")
    store.save_budget("tiny", "toy", 2, "parallel", "alice")
    store.save_budget("tiny", "toy", 4, "sequential", "bob", "better on long tasks")
    store.save_budget("tiny", "toy", 3, "select", "cy")
    assert list(store.budgets(model="tiny")["budget"]) == [3, 4, 2]
    with pytest.raises(ValueError, match="parallel, sequential, select"):
        store.save_budget("tiny", "toy", 1, "sideways")


def _set_db_version(root, version):
    con = duckdb.connect(str(root / "studio.duckdb"))
    con.execute("UPDATE schema_info SET version = ?", [version])
    con.close()


def test_a_newer_database_is_refused_with_a_clear_error(tmp_path):
    Store(tmp_path).close()
    _set_db_version(tmp_path, SCHEMA_VERSION + 5)
    with pytest.raises(SchemaVersionError, match=rf"newer than this build's {SCHEMA_VERSION}"):
        Store(tmp_path)


def test_an_older_database_opens_keeps_its_labels_and_is_marked_current(tmp_path):
    with Store(tmp_path) as store:
        store.save_budget("tiny", "toy", 2, "parallel", "alice")
    _set_db_version(tmp_path, 1)
    with Store(tmp_path) as store:
        assert list(store.budgets()["budget"]) == [2]
    con = duckdb.connect(str(tmp_path / "studio.duckdb"))
    assert con.execute("SELECT version FROM schema_info").fetchone() == (SCHEMA_VERSION,)
    con.close()


def test_foreign_database_is_refused(tmp_path):
    con = duckdb.connect(str(tmp_path / "studio.duckdb"))
    con.execute("CREATE TABLE stuff (x INTEGER)")
    con.close()
    with pytest.raises(SchemaVersionError, match="not created by envace-studio"):
        Store(tmp_path)


def test_second_process_gets_a_clear_lock_error(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        from storage import Store, StoreLockedError
        try:
            Store({str(tmp_path)!r})
        except StoreLockedError as err:
            print(err)
            sys.exit(3)
        """
    )
    with Store(tmp_path):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert "Only one studio may own a data folder" in done.stdout
    assert issubclass(StoreLockedError, RuntimeError)


def test_index_follows_replaced_and_deleted_shards(root):
    import shutil

    with Store(root) as store:  # a database file: the index persists across reopening
        assert store.count_episodes(run_id="r1") == 16
    with Store(root) as store:
        assert store.count_episodes(run_id="r1") == 16  # reopened: nothing indexed twice
        writer = RunWriter(root / "runs" / "r1")
        writer.episodes(1, make_step(1, 3, "r1"))  # a resumed job rewrites step 1, smaller
        assert store.count_episodes(run_id="r1") == 8 + 3
        assert len(store.pairs(run_id="r1", limit=1000)) == (8 + 3) * 3
        shutil.rmtree(root / "runs" / "r2")
        assert store.count_episodes(run_id="r2") == 0
        assert set(store.runs()["run_id"]) == {"r1"}
        assert store.fidelity_by_tool("r2").empty


def test_a_foreign_file_among_the_shards_is_skipped(root, caplog):
    (root / "runs" / "r1" / "episodes" / "step-000099.parquet").write_bytes(b"not parquet")
    with Store(root, url=MEMORY) as store:
        assert store.count_episodes(run_id="r1") == 16
        assert store.count_episodes(run_id="r1") == 16  # skipped once, not retried each query
    assert sum("not indexing" in r.message for r in caplog.records) == 1
