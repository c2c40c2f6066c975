"""Role-wise GRPO advantages: hand-computed numbers and invariants.

The group ``g`` used below (rows per trajectory and role)::

    trajectory  reward  act rows  rehearse rows
    e1          1.0     3         2
    e2          0.0     1         0
    e3          0.5     2         1
    e4          None    2         0        (unscorable: no baseline, no advantage)
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace_engine.training.advantages import compute_advantages, row_advantages, scorable
from envace_engine.types import Role, TrainRow

LAYOUT = [("e1", 1.0, 3, 2), ("e2", 0.0, 1, 0), ("e3", 0.5, 2, 1), ("e4", None, 2, 0)]


def _group(group: str = "g") -> tuple[list, list, list, list]:
    groups, roles, rewards, trajs = [], [], [], []
    for traj, reward, acts, rehearses in LAYOUT:
        for role, count in (("act", acts), ("rehearse", rehearses)):
            for _ in range(count):
                groups.append(group)
                roles.append(role)
                rewards.append(reward)
                trajs.append(f"{group}/{traj}")
    return groups, roles, rewards, trajs


def _by_traj_role(advantages, roles, trajs) -> dict[tuple[str, str], float | None]:
    out: dict[tuple[str, str], float | None] = {}
    for adv, role, traj in zip(advantages, roles, trajs, strict=True):
        key = (traj.split("/")[1], role)
        assert out.get(key, adv) == adv  # every row of a trajectory and role gets the same value
        out[key] = adv
    return out


def test_rows_pooling_by_hand():
    groups, roles, rewards, trajs = _group()
    got = _by_traj_role(compute_advantages(groups, roles, rewards, trajs), roles, trajs)
    # act rows: 1,1,1,0,.5,.5 -> mean 2/3; rehearse rows: 1,1,.5 -> mean 5/6
    assert got[("e1", "act")] == pytest.approx(1 / 3)
    assert got[("e2", "act")] == pytest.approx(-2 / 3)
    assert got[("e3", "act")] == pytest.approx(-1 / 6)
    assert got[("e1", "rehearse")] == pytest.approx(1 / 6)
    assert got[("e3", "rehearse")] == pytest.approx(-1 / 3)
    assert got[("e4", "act")] is None


def test_trajectories_pooling_by_hand():
    groups, roles, rewards, trajs = _group()
    adv = compute_advantages(groups, roles, rewards, trajs, pooling="trajectories")
    got = _by_traj_role(adv, roles, trajs)
    # act: e1, e2, e3 once each -> mean 0.5; rehearse: only e1 and e3 have rows -> mean 0.75
    assert got[("e1", "act")] == pytest.approx(0.5)
    assert got[("e2", "act")] == pytest.approx(-0.5)
    assert got[("e3", "act")] == pytest.approx(0.0)
    assert got[("e1", "rehearse")] == pytest.approx(0.25)
    assert got[("e3", "rehearse")] == pytest.approx(-0.25)
    assert got[("e4", "act")] is None


def test_shared_baseline_when_not_role_wise():
    groups, roles, rewards, trajs = _group()
    rows = _by_traj_role(
        compute_advantages(groups, roles, rewards, trajs, role_wise=False), roles, trajs
    )
    # all 9 scorable rows: 6.5 / 9
    assert rows[("e1", "act")] == rows[("e1", "rehearse")] == pytest.approx(1 - 6.5 / 9)
    assert rows[("e2", "act")] == pytest.approx(-6.5 / 9)
    adv = compute_advantages(groups, roles, rewards, trajs, pooling="trajectories", role_wise=False)
    trajectories = _by_traj_role(adv, roles, trajs)
    assert trajectories[("e3", "rehearse")] == pytest.approx(0.0)  # mean of 1, 0, .5 is .5


def test_std_scaling_by_hand():
    groups, roles, rewards, trajs = _group()
    adv = compute_advantages(groups, roles, rewards, trajs, scale_by_std=True)
    rows = _by_traj_role(adv, roles, trajs)
    # act rows: unbiased variance of (1,1,1,0,.5,.5) = (3/9 + 4/9 + 2/36) / 5 = 1/6
    assert rows[("e1", "act")] == pytest.approx((1 / 3) / math.sqrt(1 / 6), rel=1e-5)
    adv = compute_advantages(
        groups, roles, rewards, trajs, pooling="trajectories", scale_by_std=True
    )
    traj = _by_traj_role(adv, roles, trajs)
    # act trajectories 1, 0, .5: std 0.5 -> advantages +1, -1, 0
    assert traj[("e1", "act")] == pytest.approx(1.0, rel=1e-5)
    assert traj[("e2", "act")] == pytest.approx(-1.0, rel=1e-5)


@pytest.mark.parametrize("pooling", ["rows", "trajectories"])
@pytest.mark.parametrize("scale_by_std", [False, True])
def test_group_of_one_gives_zero(pooling, scale_by_std):
    # group g: one trajectory with three act rows (0.1 x 3 / 3 != 0.1 in floats) and a rehearse
    # row; group h: one row. Both must give exactly 0.
    adv = compute_advantages(
        ["g", "g", "g", "g", "h"],
        ["act", "act", "act", "rehearse", "act"],
        [0.1, 0.1, 0.1, 0.1, 0.3],
        ["a", "a", "a", "a", "b"],
        pooling=pooling,
        scale_by_std=scale_by_std,
    )
    assert adv == [0.0] * 5


def test_unscorable_trajectory_does_not_move_the_baseline():
    groups, roles, rewards, trajs = _group()
    with_none = compute_advantages(groups, roles, rewards, trajs)
    keep = [i for i, r in enumerate(rewards) if r is not None]
    without = compute_advantages(
        *([seq[i] for i in keep] for seq in (groups, roles, rewards, trajs))
    )
    assert [with_none[i] for i in keep] == without
    zero_scored = [0.0 if r is None else r for r in rewards]
    assert compute_advantages(groups, roles, zero_scored, trajs)[0] != with_none[0]


def test_train_rows_and_scorable():
    def row(ep: str, role: Role, reward: float | None) -> TrainRow:
        return TrainRow(ep, "g", role, (1, 2), (3,), (-0.5,), reward)

    rows = [row("a", Role.ACT, 1.0), row("b", Role.ACT, None), row("c", Role.REHEARSE, 0.0)]
    adv = row_advantages(rows, role_wise=False)
    assert adv == [0.5, None, -0.5]
    kept, kept_adv = scorable(rows, adv)
    assert [r.episode_id for r in kept] == ["a", "c"] and kept_adv == [0.5, -0.5]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="differ in length"):
        compute_advantages(["g"], ["act", "act"], [1.0], ["a"])
    with pytest.raises(ValueError, match="use None"):
        compute_advantages(["g"], ["act"], [float("nan")], ["a"])
    with pytest.raises(ValueError, match="one reward per trajectory"):
        compute_advantages(
            ["g", "g"], ["act", "act"], [1.0, 0.5], ["a", "a"], pooling="trajectories"
        )
    with pytest.raises(ValueError, match="pooling"):
        compute_advantages(["g"], ["act"], [1.0], ["a"], pooling="episodes")  # type: ignore[arg-type]


_rows = st.lists(
    st.tuples(
        st.sampled_from(["g1", "g2"]),
        st.sampled_from(["act", "rehearse"]),
        st.integers(0, 4),  # trajectory index within the group
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(_rows, st.lists(st.sampled_from([0.0, 0.25, 1.0, None]), min_size=10, max_size=10))
def test_advantages_sum_to_zero_per_pool(rows, reward_table):
    groups = [g for g, _, _ in rows]
    roles = [r for _, r, _ in rows]
    trajs = [f"{g}/{t}" for g, _, t in rows]
    rewards = [reward_table[(g == "g2") * 5 + t] for g, _, t in rows]
    by_rows = compute_advantages(groups, roles, rewards, trajs)
    by_traj = compute_advantages(groups, roles, rewards, trajs, pooling="trajectories")
    for pool in {(g, r) for g, r in zip(groups, roles, strict=True)}:
        idx = [i for i in range(len(rows)) if (groups[i], roles[i]) == pool]
        scored = [i for i in idx if rewards[i] is not None]
        assert all(by_rows[i] is None for i in idx if rewards[i] is None)
        assert sum(by_rows[i] for i in scored) == pytest.approx(0.0, abs=1e-9)
        once = {trajs[i]: by_traj[i] for i in scored}  # one value per trajectory
        assert sum(once.values()) == pytest.approx(0.0, abs=1e-9)


def test_rewards_per_row_pool_as_rows():
    # trajectory a: rehearse rows 1.0 and 0.5 (a reward per row); b: one rehearse row 0.0.
    # Pool mean (1 + 0.5 + 0) / 3 = 0.5; act rows keep their own pool: mean (1 + 0) / 2.
    adv = compute_advantages(
        ["g"] * 5,
        ["rehearse", "rehearse", "rehearse", "act", "act"],
        [1.0, 0.5, 0.0, 1.0, 0.0],
        ["a", "a", "b", "a", "b"],
    )
    assert adv == pytest.approx([0.5, 0.0, -0.5, 0.5, -0.5])
