"""Write the tiny per-schema-version runs that tests open (``tests/fixtures/schema/``).

    python scripts/make_schema_fixtures.py v1 --from studio/demo/bundle/study-toy--envace
    python scripts/make_schema_fixtures.py current

``v1`` slices a run written by the version-1 writer (its shards are kept as that writer wrote
them: only the first episodes of its last step and the first metric steps are kept, and the run
id is renamed); ``current`` writes a run with this build's ``RunWriter``. A new schema version
adds its own folder here, written by that version's writer, and the older folders stay as they
are: they are what keeps old data readable.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage.schema import SCHEMA_VERSION  # noqa: E402
from storage.shards import RunWriter  # noqa: E402
from storage.synthetic import make_step  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "schema"
EPISODE_TABLES = ("episodes", "segments", "calls", "rehearsals")


def _renamed(table: pa.Table, run_id: str) -> pa.Table:
    index = table.column_names.index("run_id")
    return table.set_column(index, "run_id", pa.array([run_id] * table.num_rows, pa.string()))


def slice_run(src: Path, version: int, episodes: int = 3, metric_steps: int = 3) -> Path:
    """Copy a few episodes and metric steps of run ``src`` (written at ``version``)."""
    run_id = f"schema-v{version}"
    out = FIXTURES / f"v{version}" / run_id
    shutil.rmtree(out, ignore_errors=True)
    manifest = json.loads((src / "run.json").read_text())
    if manifest.get("schema_version", 1) != version:
        raise SystemExit(f"{src} is schema version {manifest.get('schema_version')}, not {version}")
    for table in EPISODE_TABLES:
        last = sorted((src / table).glob("*.parquet"))[-1]
        data = pq.read_table(last)
        data = data.filter(pc.less(data["episode_index"], episodes))
        (out / table).mkdir(parents=True)
        pq.write_table(_renamed(data, run_id), out / table / last.name)
    for shard in sorted((src / "metrics").glob("*.parquet"))[:metric_steps]:
        (out / "metrics").mkdir(parents=True, exist_ok=True)
        pq.write_table(_renamed(pq.read_table(shard), run_id), out / "metrics" / shard.name)
    manifest["run_id"] = run_id
    (out / "run.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    shutil.copyfile(src / "progress.json", out / "progress.json")
    return out


def write_current() -> Path:
    """A small run written by this build's writer, two steps of four episodes."""
    root = FIXTURES / f"v{SCHEMA_VERSION}"
    shutil.rmtree(root, ignore_errors=True)
    run_id = f"schema-v{SCHEMA_VERSION}"
    with RunWriter.create(root, "train", model="tiny", suite="toy", run_id=run_id) as writer:
        for step in range(2):
            writer.episodes(step, make_step(step, 4, run_id))
            writer.metrics(step, {"reward/act": 0.25 * step, "loss": 1.0 / (step + 1)})
            writer.progress(step + 1, 2)
    # RunWriter writes <root>/runs/<id>: the fixture keeps one level, like the v1 folder
    shutil.move(str(root / "runs" / run_id), str(root / run_id))
    (root / "runs").rmdir()
    return root / run_id


def main() -> None:
    """Parse arguments and write one fixture."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["v1", "current"])
    parser.add_argument("--from", dest="src", type=Path, help="the v1 run to slice")
    args = parser.parse_args()
    if args.which == "v1":
        if args.src is None:
            raise SystemExit("v1 needs --from RUN_DIR (a run written by the version-1 writer)")
        print(slice_run(args.src, 1))
    else:
        print(write_current())


if __name__ == "__main__":
    main()
