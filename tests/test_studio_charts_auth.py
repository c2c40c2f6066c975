"""Chart builders (hand-computed aggregates) and the write policy."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from studio import charts
from studio.auth import AuthError, AuthPolicy


def test_budget_summary_mean_and_standard_error():
    df = pd.DataFrame(
        {
            "mode": ["parallel"] * 3 + ["sequential"],
            "budget": [2, 2, 2, 2],
            "success": [1.0, 0.0, 1.0, 1.0],
            "rehearsal_tokens": [100, 200, 300, 50],
        }
    )
    s = charts.budget_summary(df).set_index("mode")
    # parallel: mean 2/3; sample std = sqrt(((1/3)^2*2 + (2/3)^2)/2) = sqrt(1/3); sem = std/sqrt(3)
    assert s.loc["parallel", "success"] == pytest.approx(2 / 3)
    assert s.loc["parallel", "sem"] == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    assert s.loc["parallel", "rehearsal_tokens"] == pytest.approx(200.0)
    assert s.loc["parallel", "n"] == 3
    assert s.loc["sequential", "sem"] == 0.0  # one sample: no spread to show
    assert s.loc["parallel", "hi"] == pytest.approx(2 / 3 + 1 / 3)


def test_charts_build_vega_specs():
    curves = pd.DataFrame(
        {
            "step": [0, 1, 0, 1],
            "name": ["reward/act", "reward/act", "loss", "loss"],
            "value": [0.1, 0.4, 2.0, 1.5],
        }
    )
    spec = charts.curves(curves, ("reward/",), "reward per role").to_dict()
    assert [row["name"] for row in spec["datasets"][next(iter(spec["datasets"]))]] == [
        "reward/act",
        "reward/act",
    ]
    conf = pd.DataFrame(
        {"predicted_status": ["ok", "error"], "real_status": ["ok", "ok"], "n": [5, 2]}
    )
    assert "layer" in charts.confusion(conf).to_dict()


@pytest.mark.parametrize("builder", [charts.confusion, charts.by_tool, charts.budget])
def test_empty_frames_give_a_message_chart(builder):
    spec = builder(pd.DataFrame()).to_dict()
    assert spec["mark"]["type"] == "text"


def test_curves_without_matching_metrics_says_so():
    df = pd.DataFrame({"step": [0], "name": ["loss"], "value": [1.0]})
    spec = charts.curves(df, ("fidelity/",), "fidelity").to_dict()
    data = spec["datasets"][next(iter(spec["datasets"]))]
    assert data == [{"text": "no fidelity yet: they appear after the first step"}]


def test_open_mode_records_local_author():
    policy = AuthPolicy.from_settings(None, space_id="")
    assert policy.mode == "open"
    assert policy.author(None)
    assert policy.author("ana") == "ana"


def test_password_mode_is_read_only_until_sign_in():
    policy = AuthPolicy.from_settings("ana:s3cret", space_id="")
    with pytest.raises(AuthError, match="read-only: sign in in the Sign in box"):
        policy.author(None, "annotate")
    assert policy.sign_in("ana", "s3cret") == "ana"
    with pytest.raises(AuthError, match="wrong user name or password"):
        policy.sign_in("ana", "nope")


def test_space_mode_uses_hugging_face_login():
    policy = AuthPolicy.from_settings("ana:s3cret", space_id="me/studio")
    assert policy.mode == "hf"
    with pytest.raises(AuthError, match="Hugging Face button"):
        policy.author(None)
    with pytest.raises(AuthError, match="Hugging Face button"):
        policy.sign_in("ana", "s3cret")


@pytest.mark.parametrize("bad", ["ana", ":x", "ana:"])
def test_bad_auth_setting_is_explained(bad):
    with pytest.raises(AuthError, match="must look like user:pass"):
        AuthPolicy.from_settings(bad, space_id="")


def test_demo_bundle_installs_only_into_an_empty_folder(tmp_path):
    from studio.demo import install

    bundle = tmp_path / "bundle"
    (bundle / "demo-envace" / "episodes").mkdir(parents=True)
    (bundle / "demo-envace" / "run.json").write_text("{}")
    (bundle / "demo-envace" / "episodes" / "step-000000.parquet").write_bytes(b"x")
    root = tmp_path / "root"
    assert install(root, bundle) == ["demo-envace"]
    assert (root / "runs" / "demo-envace" / "episodes" / "step-000000.parquet").is_file()
    assert install(root, bundle) == []  # never twice, never over existing runs
