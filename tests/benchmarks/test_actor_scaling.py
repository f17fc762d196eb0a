"""`python -m benchmarks.actor_scaling`: its model of the actor-learner on N nodes and its
section of docs/scaling.md (no Ray and no measurement here)."""

import pytest

from benchmarks import actor_scaling

# One environment's figures as `measure` stores them: fragments of 16 x 50 = 800 steps,
# 0.1 s each in-process, 0.125 s on Ray with two in flight; the learner's updates.
ENTRY = {"config": "pendulum_appo", "envs_per_actor": 16, "rollout_length": 50,
         "inprocess": 0.1,
         "ray": {"pipelined": 0.125, "call": 0.14, "recording": 0.11, "receive": 0.002,
                 "bytes": 800 * 100},
         "learner": {"impala": 0.018, "appo": 0.198}}
FIGURES = {"date": "2026-11-29", "cpu_count": 2, "load_average": [1.0, 1.5],
           "envs": {"Pendulum": ENTRY}}


def test_costs_are_per_fragment_figures_turned_into_rates():
    costs = actor_scaling.costs(ENTRY)
    assert costs["steps"] == 800
    assert costs["actor"] == pytest.approx(800 / 0.125)  # 6,400 steps/s
    assert costs["inprocess"] == pytest.approx(8000)
    assert costs["ray_cost"] == pytest.approx(0.03)
    assert costs["bytes_per_step"] == pytest.approx(100)
    assert costs["learner"]["impala"] == pytest.approx(800 / 0.02)  # 40,000 steps/s
    assert costs["learner"]["appo"] == pytest.approx(800 / 0.2)  # 4,000 steps/s


def test_the_actors_add_steps_until_the_learner_or_the_network_bounds_them():
    # Each node: 2 actors of 6,400 steps/s. The appo learner takes 4,000: bound at 1 node.
    assert actor_scaling.model(ENTRY, "appo", 1) == (pytest.approx(4000), "learner")
    assert actor_scaling.model(ENTRY, "impala", 1) == (pytest.approx(12800), "actors")
    assert actor_scaling.model(ENTRY, "impala", 3) == (pytest.approx(38400), "actors")
    assert actor_scaling.model(ENTRY, "impala", 4) == (pytest.approx(40000), "learner")
    assert actor_scaling.learner_nodes(ENTRY, "impala") == pytest.approx(40000 / 12800)
    # 100 bytes a step over 1.25 GB/s: 12.5M steps/s, past a learner 1,000 times faster.
    fast = dict(ENTRY, learner={"impala": 1e-6, "appo": 1e-6}, ray=dict(ENTRY["ray"],
                                                                      receive=0.0))
    assert actor_scaling.model(fast, "impala", 10_000) == (pytest.approx(12.5e6), "network")


def test_the_section_is_rewritten_in_place(tmp_path):
    path = tmp_path / "scaling.md"
    path.write_text("# Scaling\n\nbefore\n")
    actor_scaling.write_section(path, actor_scaling.section(FIGURES))
    actor_scaling.write_section(path, actor_scaling.section(FIGURES))
    text = path.read_text()
    assert text.count(actor_scaling.BEGIN) == 1 and text.startswith("# Scaling\n\nbefore\n")
    assert "| Pendulum | 800 | 8,000 | 6,400 | 0.80× | 30.0 ms |" in text
    assert "| 4 | 128 | 40,000 | 0.78× | learner | 4,000 | 0.25× | learner |" in text
    assert "impala: its bound, 40,000 steps/s, is reached at 3.1 nodes" in text
