"""Hosting on a Space: data folder, writers, job and model limits, and owner-only writes."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import httpx
import pytest

from studio import space
from studio.auth import AuthError, AuthPolicy
from studio.context import Studio
from studio.jobs import JobError, JobManager
from studio.pages import annotate, budget, runs
from tests.browser import studio_server
from tests.studio_data import make_run

ROOT = Path(__file__).parents[1]


def test_the_root_app_file_serves_the_studio(tmp_path):
    with studio_server(tmp_path, app_file=True) as url:
        page = httpx.get(url, timeout=10)
    assert page.status_code == 200 and "EnvACE Studio" in page.text


def test_data_root_prefers_persistent_storage(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVACE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert space.data_root(tmp_path / "absent") == tmp_path / "home" / "envace-runs"
    (tmp_path / "data").mkdir()
    assert space.data_root(tmp_path / "data") == tmp_path / "data" / "envace"
    monkeypatch.setenv("ENVACE_HOME", str(tmp_path / "mine"))
    assert space.data_root(tmp_path / "data") == tmp_path / "mine"


def test_writers_are_the_owner_and_the_listed_users(monkeypatch):
    monkeypatch.setenv("SPACE_AUTHOR_NAME", "owner")
    monkeypatch.setenv("ENVACE_WRITERS", " ana, bo ,")
    assert space.writers() == {"owner", "ana", "bo"}
    monkeypatch.setenv("SPACE_ID", "owner/envace")
    policy = AuthPolicy.from_settings(None)
    assert policy.mode == "hf" and policy.may_write("ana") and not policy.may_write("mallory")
    assert policy.author("owner") == "owner"
    with pytest.raises(AuthError, match="mallory may browse this Space but not annotate"):
        policy.author("mallory", "annotate")
    assert "browsing read-only" in policy.banner("mallory")
    everyone = AuthPolicy(mode="hf", writers=frozenset({"*"}))
    assert everyone.author("anyone") == "anyone"


def _safetensors(folder: Path, shapes: dict[str, list[int]]) -> None:
    """A weights file holding only its header (sizing reads nothing else)."""
    header = {n: {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for n, s in shapes.items()}
    body = json.dumps({**header, "__metadata__": {"format": "pt"}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body)


def test_model_cap_counts_checkpoint_parameters_from_headers(tmp_path):
    _safetensors(tmp_path, {"a": [1000, 1000], "b": [10]})
    assert space.checkpoint_params(tmp_path) == 1_000_010
    limits = space.HostLimits(max_model_params=2_000_000)
    limits.check_model(str(tmp_path))
    with pytest.raises(space.LimitError, match="135 M parameters; this Space allows at most 2 M"):
        limits.check_model("smollm2-135m")
    with pytest.raises(space.LimitError, match="own CPU only"):
        limits.check_model("sglang+http://10.0.0.1:30000")
    with pytest.raises(space.LimitError, match=r"no \.safetensors"):
        limits.check_model(str(tmp_path / "empty"))
    space.HostLimits().check_model("anything")  # no cap off a Space
    space.HostLimits.for_space().check_model("smollm2-135m")  # the default cap fits it


def test_the_registry_sizes_match_the_real_models():
    from envace_engine.models import ensure_smollm2, ensure_tiny, registry

    assert set(space.REGISTRY_PARAMS) == set(registry())
    real = {"smollm2-135m": ensure_smollm2(), "tiny": ensure_tiny()}
    for name, folder in real.items():
        assert space.checkpoint_params(Path(folder)) == pytest.approx(
            space.REGISTRY_PARAMS[name], rel=0.05
        ), name


def test_one_job_at_a_time(tmp_path):
    jobs = JobManager(tmp_path, max_active=1)
    first = jobs.launch("rollout", [sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(JobError, match=f"1 job\\(s\\) at a time and {first.run_id}"):
            jobs.launch("rollout", [sys.executable, "-c", "pass"])
    finally:
        jobs.cancel(first.run_id)
    done = jobs.launch("rollout", [sys.executable, "-c", "pass"])  # room again
    assert done.status == "running"


@pytest.fixture
def hosted(tmp_path):
    """A studio as a Space runs it: owner ``owner``, one job at a time, the default model cap."""
    make_run(tmp_path)
    policy = AuthPolicy(mode="hf", writers=frozenset({"owner"}))
    studio = Studio.open(tmp_path, policy, space.HostLimits.for_space())
    yield studio
    studio.store.close()


FORM = {
    "kind": "rollout",
    "model": "tiny",
    "suite": "toy",
    "episodes": 2,
    "group": 2,
    "modes": ["parallel"],
}


def test_every_write_is_refused_to_visitors_and_other_accounts(hosted):
    for user in (None, "mallory"):
        refused = "sign in" if user is None else "may browse this Space but not"
        assert refused in runs.launch(hosted, user, FORM)[0]
        assert refused in runs.cancel(hosted, user, "train-demo")
        assert refused in runs.resume(hosted, user, "train-demo")
        assert refused in budget.launch_sweep(hosted, user, {**FORM, "kind": "sweep"})[0]
        assert refused in annotate.save(hosted, user, "call", "ep-0-1/1", "faithful", "")[0]
        assert refused in budget.save_choice(hosted, user, "train-demo", 1, "parallel", "")[0]
    assert hosted.store.annotations().empty and hosted.jobs.jobs() == []


def test_the_owner_writes_within_the_limits(hosted):
    message, _ = annotate.save(hosted, "owner", "call", "ep-0-1/1", "faithful", "")
    assert "as **owner**" in message
    message, _ = budget.save_choice(hosted, "owner", "train-demo", 1, "parallel", "")
    assert message.startswith("Saved budget")
    message, run_id = runs.launch(hosted, "owner", FORM)
    assert run_id is not None, message
    try:
        message, second = runs.launch(hosted, "owner", FORM)
        assert second is None and "1 job(s) at a time" in message
    finally:
        hosted.jobs.cancel(run_id)
    big = {**FORM, "model": "sglang+http://10.0.0.1:30000"}
    message, none = runs.launch(hosted, "owner", big)
    assert none is None and "own CPU only" in message


def test_live_rehearse_keeps_to_the_model_cap(tmp_path):
    """On a Space the live rehearse worker loads no model over the cap (it would run beside
    the Space's one job), for stored calls and written ones alike."""
    from studio.pages import rehearse

    make_run(tmp_path)
    policy = AuthPolicy(mode="hf", writers=frozenset({"owner"}))
    capped = Studio.open(tmp_path, policy, space.HostLimits(max_model_params=2_000_000))
    client = rehearse.RehearseClient()
    try:
        live, *_ = rehearse.live_rehearse(capped, client, "ep-0-1", 1, "smollm2-135m", 0.0)
        assert "Cannot rehearse" in live and "at most 2 M" in live
        call = '{"name": "get_balance", "arguments": {"account": "dan"}}'
        live, *_ = rehearse.rehearse_new_call(
            capped, client, "toy", "validation", "toy/s2-0", call, "smollm2-135m", 0.0
        )
        assert "Cannot rehearse" in live and "at most 2 M" in live
    finally:
        client.close()
        capped.store.close()
