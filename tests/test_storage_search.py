"""Search over a run's segments and rehearsals, combined with structured filters."""

from __future__ import annotations

import pytest

from storage import Store
from storage.search import SearchQuery, snippet
from tests.studio_data import make_run


@pytest.fixture
def store(tmp_path):
    make_run(tmp_path)  # 2 steps x 4 episodes; reward 0 ones have a real `ship` error
    s = Store(tmp_path)
    yield s
    s.close()


def test_text_roles_and_filters_combine(store):
    hits = store.search.find(SearchQuery("train-demo", "SHIPPED 500", roles=("act",)))
    assert len(hits) == 8 and set(hits["role"]) == {"act"}  # case-insensitive, every episode
    assert list(hits["step"]) == sorted(hits["step"])  # run order
    rehearsed = store.search.find(
        SearchQuery("train-demo", "execution_result", roles=("rehearse",))
    )
    assert len(rehearsed) == 16  # two world-role generations per episode
    mismatch = store.search.find(
        SearchQuery("train-demo", "shipped 500", roles=("act",), status_mismatch=True)
    )
    failed = store.episodes(run_id="train-demo", limit=100)
    want = set(failed.loc[failed["reward"] == 0, "episode_id"])
    assert set(mismatch["episode_id"]) == want and len(want) == 4
    rewarded = store.search.find(SearchQuery("train-demo", "bolts", roles=("act",), reward_min=0.5))
    assert set(rewarded["reward"]) == {1.0}
    assert store.search.find(SearchQuery("train-demo", "bolts", tool="nope")).empty
    assert len(store.search.find(SearchQuery("train-demo", "bolts", limit=3))) == 3


def test_search_text_is_a_parameter_and_bad_queries_say_why(store):
    assert store.search.find(SearchQuery("train-demo", "'; DROP TABLE annotations; --")).empty
    assert not store.search.find(SearchQuery("train-demo", "bolts")).empty  # nothing was dropped
    with pytest.raises(ValueError, match="type something"):
        SearchQuery("train-demo", "  ")
    with pytest.raises(ValueError, match="roles \\['moon'\\]"):
        SearchQuery("train-demo", "x", roles=("moon",))


def test_snippet_marks_the_match():
    text = "a" * 100 + "Needle <b>" + "z" * 100
    out = snippet(text, "needle <B>", width=5)
    assert out == "…aaaaa<mark>Needle &lt;b&gt;</mark>zzzzz…"
    assert snippet("no match here", "x") == "no match here"
