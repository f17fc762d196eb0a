"""`python -m benchmarks.apex_scaling`: the actor-learner's model extended to Ape-X, with the
replay ratio held, and its section of docs/scaling.md (no Ray and no measurement here)."""

import pytest

from benchmarks import apex_scaling

# One config's figures as `measure` stores them: calls of 16 x 16 = 256 steps, 0.02 s each
# in-process, 0.032 s on Ray with two in flight; the learner stores one call's transitions
# in 0.0064 s and with its 64 updates (0.25 a step) takes 0.254 s; receiving takes 0.002 s.
ENTRY = {"config": "minatar_breakout_apex", "envs_per_actor": 16, "rollout_length": 16,
         "updates_per_step": 0.25, "inprocess": 0.02,
         "ray": {"pipelined": 0.032, "call": 0.04, "recording": 0.03, "receive": 0.002,
                 "bytes": 256 * 1000},
         "learner": {"insert": 0.0064, "learn": 0.254, "batch_size": 128}}
FIGURES = {"date": "2026-11-29", "cpu_count": 2, "load_average": [1.0, 1.5],
           "envs": {"Breakout": ENTRY}}


def test_costs_turn_per_call_figures_into_rates_at_the_held_ratio():
    costs = apex_scaling.costs(ENTRY)
    assert costs["steps"] == 256
    assert costs["actor"] == pytest.approx(256 / 0.032)  # 8,000 steps/s
    assert costs["inprocess"] == pytest.approx(12800)
    assert costs["ray_cost"] == pytest.approx(0.01)
    assert costs["insert"] == pytest.approx(25e-6)
    assert costs["learner"] == pytest.approx(256 / 0.256)  # 1,000 steps/s
    assert costs["updates"] == pytest.approx(250)  # 0.25 updates per step
    # A quarter of the ratio: a quarter of the updates' 0.2476 s, the rest as it was.
    quarter = apex_scaling.costs(ENTRY, 0.0625)
    assert quarter["learner"] == pytest.approx(256 / (0.0064 + 0.2476 / 4 + 0.002))
    assert quarter["updates"] == pytest.approx(0.0625 * quarter["learner"])


def test_actors_add_steps_until_the_learner_at_its_ratio_bounds_them():
    # Each node: 2 actors of 8,000 steps/s, past the learner's 1,000 at once.
    assert apex_scaling.model(ENTRY, 1) == (pytest.approx(1000), "learner")
    slow = dict(ENTRY, ray=dict(ENTRY["ray"], pipelined=2.56))  # 100 steps/s an actor.
    assert apex_scaling.model(slow, 2) == (pytest.approx(400), "actors")
    assert apex_scaling.model(slow, 8) == (pytest.approx(1000), "learner")
    assert apex_scaling.model(slow, 8, 0.0625)[1] == "actors"  # 800 < 3,642 steps/s.
    # 1,000 bytes a step over 1.25 GB/s: 1.25M steps/s, below a learner 10,000 times faster.
    fast = dict(ENTRY, learner={"insert": 0.0, "learn": 1e-7, "batch_size": 128},
                ray=dict(ENTRY["ray"], receive=0.0))
    assert apex_scaling.model(fast, 10_000) == (pytest.approx(1.25e6), "network")


def test_the_section_reports_the_ratio_and_the_updates_it_implies(tmp_path):
    text = apex_scaling.section(FIGURES)
    assert text.startswith(apex_scaling.BEGIN) and text.rstrip().endswith(apex_scaling.END)
    assert ("| `minatar_breakout_apex` | 256 | 12,800 | 8,000 | 10.0 ms | 2.00 ms | 1000 "
            "| 25.0 µs | 0.25 | 1,000 | 250 |") in text
    assert ("| 2 | 64 | 1,000 | 250 | learner | 3,642 | 228 | learner | 10,723 | 168 "
            "| learner |") in text
    assert "at 0.25, 1,000 steps/s, reached at 0.06 nodes" in text
