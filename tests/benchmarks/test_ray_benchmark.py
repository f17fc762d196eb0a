"""`python -m benchmarks.ray_scaling`: its model of scaling out, its sections of the docs, and
its stepping calls on in-process environments (no Ray and no measurement here)."""

import pytest

from benchmarks import ray_scaling as ray_benchmark
from benchmarks.throughput import report as throughput_report

# Per-step costs in seconds, as `measure` stores them: Ray per batch step by actors (wall,
# this process's CPU) with a 50 us slope; the learner 1 ms + 2 us per environment.
FIGURES = {
    "date": "2026-11-24", "effective_cores": [1.5, 1.4], "load_average": [9.0, 9.5],
    "pairs": [{"env": "HalfCheetah-v5", "level": "raw", "ratios": [0.5, 0.6, 0.7],
               "ray": 6000.0, "parallel": 10000.0}],
    "single": {"HalfCheetah-v5": 100e-6, "SlowPendulum (1 ms)": 1e-3, "Pendulum-v1": 20e-6},
    "ray_overhead": {"1": [1.07e-3, 0.30e-3], "2": [1.2e-3, 0.35e-3], "4": [1.5e-3, 0.45e-3]},
    "learner": {"32": 1.064e-3, "128": 1.256e-3, "512": 2.024e-3},
    "update_seconds": 0.5,
}


def test_model_adds_the_environments_ray_and_the_learner():
    costs = ray_benchmark.costs(FIGURES)
    assert costs["d"] == pytest.approx(50e-6)
    assert costs["r"] == pytest.approx(1.07e-3 - 20e-6 - 50e-6)
    assert costs["c0"] == pytest.approx(1e-3) and costs["c1"] == pytest.approx(2e-6)
    assert costs["u"] == pytest.approx(50e-6)
    rate, environment, round_trip, trainer = ray_benchmark.model(FIGURES, "HalfCheetah-v5", 4)
    assert environment == pytest.approx(16 * 100e-6)  # The 16 environments of an actor.
    assert round_trip == pytest.approx(costs["r"] + ray_benchmark.RTT)
    assert trainer == pytest.approx(8 * 50e-6 + 1e-3 + (2e-6 + 50e-6) * 128)
    assert rate == pytest.approx(128 / (environment + round_trip + trainer))
    # More nodes never pass the learner's bound 1 / (c1 + u + 2 d / 32).
    assert ray_benchmark.model(FIGURES, "HalfCheetah-v5", 10_000)[0] < 1 / (
        2e-6 + 50e-6 + 2 * 50e-6 / 32)


def test_sections_are_rewritten_and_kept_by_the_throughput_report(tmp_path, monkeypatch):
    path = tmp_path / "performance.md"
    ray_benchmark.write_section(path, ray_benchmark.performance_section(FIGURES),
                                "performance")
    text = path.read_text()
    assert "| HalfCheetah-v5 | raw | 10,000 | 6,000 | 0.60× | 0.50–0.70 | 3 |" in text
    monkeypatch.setattr(throughput_report, "markdown", lambda report: "# Throughput\n")
    throughput_report.write_markdown({}, path)
    text = path.read_text()
    assert text.startswith("# Throughput\n") and text.count("<!-- ray-backend -->") == 1
    assert "| HalfCheetah-v5 | raw |" in text
    scaling = tmp_path / "scaling.md"
    scaling.write_text("# Scaling\n\nHand-written.\n")
    for _ in range(2):
        ray_benchmark.write_section(scaling, ray_benchmark.scaling_section(FIGURES), "scaling")
    text = scaling.read_text()
    assert text.startswith("# Scaling\n\nHand-written.\n")
    assert text.count("<!-- ray-scaling -->") == 1 and "| 64 | 2,048 |" in text


def test_raw_call_steps_the_batch_and_resets_the_ended_episodes(monkeypatch):
    """Episodes of 5 steps: 12 batch steps of 2 environments end two episodes in each."""
    from batchrl import environments
    from batchrl.environments.local import BatchEnv

    batch_env = BatchEnv([environments.create("Pendulum-v1", 5) for _ in range(2)],
                         blocking=True)
    resets = []
    reset = batch_env.reset

    def recorded(indices=None, seed=None):
        resets.append((None if indices is None else list(indices), seed))
        return reset(indices, seed)

    monkeypatch.setattr(batch_env, "reset", recorded)
    try:
        call = ray_benchmark._raw_call(batch_env)
        assert [call() for _ in range(12)] == [2] * 12
    finally:
        batch_env.close()
    assert resets == [(None, 0), ([0, 1], None), ([0, 1], None)]


def test_single_environment_cost_is_seconds_per_step():
    seconds = ray_benchmark.measure_single("Pendulum-v1", 0.02)
    assert isinstance(seconds, float) and seconds > 0
