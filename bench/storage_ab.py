"""Storage write path: this checkout against a git revision, step by step in one process.

Why. On a shared machine the speed can drift a lot within minutes, so two separate
``bench/storage.py`` runs of two versions can disagree about which is faster. Here one process
holds both writers and alternates them step by step (the same synthetic episodes, each version
writing its own run), so a slow spell hits both alike.

What is compared: ``RunWriter.episodes`` of this checkout against that of ``--base``, whose
``storage/shards.py``, ``storage/rows.py`` and ``envace_engine/fidelity/metrics.py`` are read with
``git show`` and loaded under other module names (every other module, ``storage.layout`` and
``storage.schema`` included, is this checkout's: a revision whose writer needs other versions
of those cannot be compared this way). Per step: turns per second of wall time and of the
calling thread's CPU time; the first two steps of each are dropped (start-up, the similarity
helper starting).

The last stdout line is one JSON object; ``ratio`` = this checkout's median wall turns/s over
the base's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import add_record_flag, record  # noqa: E402
from storage import RunWriter  # noqa: E402
from storage.synthetic import make_step  # noqa: E402

# (module name under which the base's file is loaded, its paths — the first one the revision
# has: the fidelity module moved into a package —, the imports it gets instead)
FIDELITY = ("envace_engine.fidelity.metrics", "envace_engine.fidelity")
BASE_MODULES = (
    ("_base_fidelity", ("envace_engine/fidelity/metrics.py", "envace_engine/fidelity.py"), ()),
    ("_base_rows", ("storage/rows.py",), tuple((f, "_base_fidelity") for f in FIDELITY)),
    ("_base_shards", ("storage/shards.py",), (("storage.rows", "_base_rows"),)),
)
WARM_UP = 2  # steps of each writer left out of the medians


def load_base(revision: str) -> types.ModuleType:
    """The base revision's ``storage.shards`` module (with its rows and fidelity modules)."""
    module = None
    for name, paths, imports in BASE_MODULES:
        path, text = _show(revision, paths)
        for old, new in imports:
            text = text.replace(f"from {old} import", f"from {new} import")
        module = types.ModuleType(name)
        module.__file__ = f"{revision}:{path}"
        sys.modules[name] = module
        exec(
            compile(text, module.__file__, "exec"), module.__dict__
        )  # the repo's own file, from git
    assert module is not None
    return module


def _show(revision: str, paths: tuple[str, ...]) -> tuple[str, str]:
    """The first of ``paths`` that exists at ``revision``, and its text."""
    errors = []
    for path in paths:
        source = subprocess.run(
            ["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, text=True
        )
        if source.returncode == 0:
            return path, source.stdout
        errors.append(source.stderr.strip())
    raise SystemExit(f"--base {revision}: cannot read {' or '.join(paths)}: {errors[-1]}")


def run(revision: str, steps: int, per_step: int) -> dict[str, Any]:
    """Alternate the two writers for ``steps`` steps each; their medians and the ratio."""
    base_writer_class = load_base(revision).RunWriter
    root = Path(tempfile.mkdtemp(prefix="envace-bench-storage-ab-"))
    try:
        writers = {
            "this": RunWriter.create(root, "rollout", run_id="this"),
            "base": base_writer_class.create(root, "rollout", run_id="base"),
        }
        template = make_step(0, per_step, "ab")
        rates: dict[str, dict[str, list[float]]] = {w: {"wall": [], "thread": []} for w in writers}
        for step in range(steps):
            for name in ("base", "this") if step % 2 else ("this", "base"):
                episodes = [replace(ep, id=f"s{step}-{ep.id}") for ep in template]
                turns = sum(len(ep.segments) for ep in episodes)
                t0, h0 = time.perf_counter(), time.thread_time()
                writers[name].episodes(step, episodes)
                rates[name]["wall"].append(turns / (time.perf_counter() - t0))
                rates[name]["thread"].append(turns / (time.thread_time() - h0))
        for writer in writers.values():
            writer.finish()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {
        w: {k: round(statistics.median(v[WARM_UP:])) for k, v in r.items()}
        for w, r in rates.items()
    }
    return {
        "bench": "storage_ab",
        "base": revision,
        "steps_each": steps,
        "episodes_per_step": per_step,
        "turns_per_step": per_step * len(template[0].segments),
        "this_turns_per_s": medians["this"]["wall"],
        "base_turns_per_s": medians["base"]["wall"],
        "this_turns_per_thread_cpu_s": medians["this"]["thread"],
        "base_turns_per_thread_cpu_s": medians["base"]["thread"],
        "thread_cpu_ratio": round(medians["this"]["thread"] / medians["base"]["thread"], 3),
        "ratio": round(medians["this"]["wall"] / medians["base"]["wall"], 3),
    }


def main() -> None:
    """Run the comparison and print one JSON line last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision to compare against")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller steps (<1 min)")
    parser.add_argument("--steps", type=int, default=0, help="steps per writer (default 17)")
    add_record_flag(parser)
    args = parser.parse_args()
    steps = args.steps or (8 if args.quick else 17)
    per_step = 2_000 if args.quick else 5_000
    if steps <= WARM_UP:
        raise SystemExit(f"--steps {steps}: use more than {WARM_UP} (the warm-up steps)")
    result = run(args.base, steps, per_step)
    print(json.dumps(result))
    if args.record:
        record(__file__, result)


if __name__ == "__main__":
    main()
