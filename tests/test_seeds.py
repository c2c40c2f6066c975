"""``derive_seed``: deterministic, separated streams, a fixed value per label tuple."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envace_engine.seeds import SEED_SPACE, derive_seed


def test_same_labels_same_seed_in_another_process():
    here = derive_seed(7, "rollout", 3, 0)
    code = "from envace_engine.seeds import derive_seed; print(derive_seed(7, 'rollout', 3, 0))"
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert int(there) == here


def test_streams_do_not_collide():
    seeds = {
        derive_seed(b, s, i) for b in range(4) for s in ("tasks", "rollout") for i in range(50)
    }
    assert len(seeds) == 4 * 2 * 50
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)  # order matters
    assert derive_seed(1, "a") != derive_seed(0, "a")


def test_range_and_label_types():
    assert all(0 <= derive_seed(b, "x") < SEED_SPACE for b in range(100))
    with pytest.raises(TypeError, match="ints or strings"):
        derive_seed(0, 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ints or strings"):
        derive_seed(0, True)
