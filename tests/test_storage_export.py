"""Export -> import round trips (Parquet and JSON Lines), datasets loading, and the CLI."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from envace_engine.cli import app
from storage import RunWriter, Store
from storage.export import export_run, import_run
from storage.synthetic import make_step

TABLE_KEYS = {
    "episodes": ["step", "episode_index"],
    "segments": ["step", "episode_id", "seq"],
    "calls": ["step", "episode_id", "call_index"],
    "rehearsals": ["step", "episode_id", "rehearsal_index"],
    "metrics": ["step", "name"],
}


@pytest.fixture
def source(tmp_path):
    """A data folder with run "src": 2 steps x 3 episodes, metrics, and one label."""
    root = tmp_path / "a"
    with RunWriter.create(root, "train", model="tiny", suite="toy", run_id="src") as w:
        for step in range(2):
            w.episodes(step, make_step(step, 3, "src"))
            w.metrics(step, {"loss": 1.0 + step})
            w.progress(step + 1, 2)
    with Store(root) as store:
        store.annotate("call", "src-ep0000001/2", "wrong-status", "should fail", "alice")
    return root


def table(store: Store, name: str, run_id: str) -> pd.DataFrame:
    """A table of one run, ordered, without the columns that name where it lives."""
    frame = store.sql(f"SELECT * EXCLUDE (filename, run_id) FROM {name} WHERE run_id = ?", [run_id])
    return frame.sort_values(TABLE_KEYS[name], ignore_index=True)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_import_round_trip(source, tmp_path, fmt):
    with Store(source) as store:
        labels = store.export_labels("src")
        files = export_run(store.run_path("src"), tmp_path / "out", fmt, labels)
        before = {name: table(store, name, "src") for name in TABLE_KEYS}
    assert {f.name for f in files} >= {f"episodes.{fmt}", f"labels.{fmt}", "run.json"}
    target = tmp_path / "b"
    manifest = import_run(tmp_path / "out", target, run_id="copy")
    assert (manifest.run_id, manifest.kind, manifest.model) == ("copy", "train", "tiny")
    with Store(target) as store:
        after = {name: table(store, name, "copy") for name in TABLE_KEYS}
        assert store.run("copy").progress.done == 2
    for name in TABLE_KEYS:
        pd.testing.assert_frame_equal(before[name], after[name], check_dtype=False, obj=name)
    first = after["segments"].iloc[1]
    assert list(first["token_ids"]) == list(before["segments"].iloc[1]["token_ids"])


def test_import_refuses_to_overwrite(source, tmp_path):
    export_run(source / "runs" / "src", tmp_path / "out")
    import_run(tmp_path / "out", tmp_path / "b")
    with pytest.raises(ValueError, match="already exists"):
        import_run(tmp_path / "out", tmp_path / "b")
    assert [p.name for p in (tmp_path / "b" / "runs").iterdir()] == ["src"]  # no staging left


def test_a_copied_run_directory_imports_as_is(source, tmp_path):
    manifest = import_run(source / "runs" / "src", tmp_path / "c")
    with Store(tmp_path / "c") as store:
        assert store.count_episodes(run_id=manifest.run_id) == 6


def test_jsonl_export_loads_with_datasets(source, tmp_path):
    from datasets import load_dataset

    export_run(source / "runs" / "src", tmp_path / "out", "jsonl")
    episodes = load_dataset("json", data_files=str(tmp_path / "out" / "episodes.jsonl"))["train"]
    assert episodes.num_rows == 6
    assert episodes[0]["episode_id"] == "src-ep0000000"
    segments = load_dataset("json", data_files=str(tmp_path / "out" / "segments.jsonl"))["train"]
    assert segments.num_rows == 6 * 8
    assert all(isinstance(t, int) for t in segments[1]["token_ids"])


def test_cli_export_import_and_list(source, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli-out"
    done = runner.invoke(
        app, ["export", "src", "--format", "jsonl", "--out", str(out), "--root", str(source)]
    )
    assert done.exit_code == 0, done.output
    assert (out / "labels.jsonl").is_file() and (out / "calls.jsonl").is_file()
    target = tmp_path / "d"
    done = runner.invoke(app, ["import", str(out), "--root", str(target), "--run-id", "again"])
    assert done.exit_code == 0, done.output
    assert "imported 1 labels" in done.output
    with Store(target) as store:
        labels = store.annotations(run_id="again")
        assert list(labels["label"]) == ["wrong-status"]
        assert (
            store.pairs(run_id="again", limit=100)
            .set_index("call_id")
            .loc["src-ep0000001/2", "label"]
            == "wrong-status"
        )
    done = runner.invoke(app, ["runs", "list", "--root", str(target)])
    assert done.exit_code == 0 and "again" in done.output and "done" in done.output
    done = runner.invoke(app, ["export", "nope", "--out", str(out), "--root", str(source)])
    assert done.exit_code != 0 and "no run 'nope'" in done.output
