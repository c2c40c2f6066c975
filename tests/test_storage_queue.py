"""The annotation queue's walk, scopes and progress, and inter-annotator agreement."""

from __future__ import annotations

import pytest

from storage import Store
from storage.agreement import agreement
from storage.queue import QueueFilter
from tests.studio_data import make_run


def test_agreement_by_hand():
    # 4 items: A = [x, x, y, y], B = [x, y, y, y]; p_o = 3/4
    # p_e = P_A(x) P_B(x) + P_A(y) P_B(y) = (2/4)(1/4) + (2/4)(3/4) = 1/2
    # kappa = (3/4 - 1/2) / (1 - 1/2) = 1/2; per label: x 2*1/(2+1) = 2/3, y 2*2/(2+3) = 4/5
    got = agreement([("x", "x"), ("x", "y"), ("y", "y"), ("y", "y")])
    assert (got.n, got.observed, got.kappa) == (4, 0.75, 0.5)
    assert got.per_label == pytest.approx({"x": 2 / 3, "y": 4 / 5})
    assert agreement([("x", "x"), ("x", "x")]).kappa == 1.0  # one label only: defined as 1
    # total disagreement with balanced marginals: p_o 0, p_e 1/2, kappa -1
    assert agreement([("x", "y"), ("y", "x")]).kappa == -1.0
    with pytest.raises(ValueError, match="at least one item"):
        agreement([])


@pytest.fixture
def store(tmp_path):
    make_run(tmp_path)
    s = Store(tmp_path)
    yield s
    s.close()


def _walk(store, f):
    out, at = [], None
    while (at := store.queue.next(f, at)) is not None:
        out.append(at)
    return out


def test_the_queue_walks_pairs_in_run_order_and_skips_what_i_labelled(store):
    everything = _walk(store, QueueFilter("train-demo", "ana", scope="all"))
    pairs = store.pairs(run_id="train-demo", limit=1000)
    assert everything == list(pairs["call_id"]) and len(everything) >= 4
    first, second = everything[:2]
    store.annotate("call", first, "faithful", author="ana")
    mine = QueueFilter("train-demo", "ana")
    assert store.queue.next(mine) == second  # the labelled one dropped out
    assert store.queue.next(mine, after=second, back=True) == first  # back still reaches it
    assert store.queue.progress(mine) == (1, len(everything))
    store.annotate("call", first, "other", author="ana")  # a change of mind counts once
    assert store.queue.progress(mine) == (1, len(everything))
    others = QueueFilter("train-demo", "bo", scope="others")
    assert _walk(store, others) == [first]  # labelled by ana, not by bo: a second opinion


def test_filters_combine_and_an_empty_queue_is_none(store):
    pairs = store.pairs(run_id="train-demo", limit=1000)
    tool = str(pairs["tool"].iloc[0])
    f = QueueFilter("train-demo", "ana", tool=tool, real_status="ok", scope="all")
    want = pairs[(pairs["tool"] == tool) & (pairs["real_status"] == "ok")]["call_id"]
    assert _walk(store, f) == list(want)
    assert store.queue.next(QueueFilter("train-demo", "ana", fidelity_min=2.0)) is None
    assert store.queue.next(QueueFilter("no-such-run", "ana")) is None
    with pytest.raises(KeyError, match="no call 'gone/0'"):
        store.queue.next(QueueFilter("train-demo", "ana"), after="gone/0")


def test_agreement_of_two_authors_on_a_run(store):
    calls = _walk(store, QueueFilter("train-demo", "ana", scope="all"))[:4]
    for call, a, b in zip(
        calls,
        ["faithful", "faithful", "other", "other"],
        ["faithful", "other", "other", "other"],
        strict=True,
    ):
        store.annotate("call", call, a, author="ana")
        store.annotate("call", call, b, author="bo")
    got = store.queue.agreement("train-demo")[("ana", "bo")]
    assert (got.n, got.observed, got.kappa) == (4, 0.75, 0.5)
    assert "'; DROP TABLE" not in str(store.queue.next(QueueFilter("x'; DROP TABLE", "a")))
