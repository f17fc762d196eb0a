"""`python -m benchmarks.rllib_appo`: how it reads RLlib's run and what its section of
docs/distributed.md says (neither RLlib nor a training run here: a stand-in peer)."""

import sys

import pytest

from benchmarks import replace_marked, rllib_appo, rllib_peer

# A stand-in for the peer's Python: prints what `benchmarks.rllib_peer` prints, whatever
# it is asked (a build in 12 s; 1,000 env steps/s; the return reaching 450 at 20 s).
STAND_IN = """#!{python}
import json
print("a line that is not JSON")
print(json.dumps({{"built": 12.0}}))
for seconds, steps, ret in ((10.0, 10000, None), (20.0, 20000, 455.0), (30.0, 30000, 300.0)):
    print(json.dumps({{"seconds": seconds, "env_steps": steps, "return": ret}}))
"""
ROWS = [{"seed": seed, "final_step": 300_160, "final_return": 500.0, "best_return": 500.0,
         "steps_to_threshold": 20_160, "seconds_to_threshold": seconds,
         "steps_per_second": speed}
        for seed, seconds, speed in ((0, 12.0, 20_000.0), (1, None, 16_000.0),
                                     (2, 8.0, 30_000.0))]


def test_the_peers_figures_come_from_its_lines(tmp_path):
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable))
    python.chmod(0o755)
    peer = rllib_appo.measure_peer(python, 30, 2, 0)
    assert peer["built"] == 12.0 and len(peer["iterations"]) == 3
    assert peer["steps_per_second"] == pytest.approx(1000.0)
    assert (peer["final_return"], peer["best_return"]) == (300.0, 455.0)
    assert peer["seconds_to_threshold"] == 20.0


def test_the_section_gives_the_median_ratio_and_seconds(tmp_path):
    peer = {"built": 12.0, "iterations": [{"seconds": 300.5, "env_steps": 300_500,
                                           "return": 327.0}],
            "steps_per_second": 1000.0, "final_return": 327.0, "best_return": 340.0,
            "seconds_to_threshold": None}
    figures = {"date": "2026-11-29", "cpu_count": 2, "load_average": [0.5, 1.5],
               "env_runners": 2, "rllib": peer, "batchrl": ROWS}
    text = rllib_appo.section(figures)
    # Median steps/s 20,000 over 1,000; seconds 8, 12 and not reached: the median is 12.
    assert "**20.0×**" in text and "**12.0**" in text
    assert "| RLlib APPO | 1,000 (sampled) |" in text and "2 env runners" in text
    path = tmp_path / "distributed.md"
    path.write_text("# Actors\n")
    for _ in range(2):
        replace_marked(path, text, rllib_appo.BEGIN, rllib_appo.END)
    assert path.read_text().count(rllib_appo.BEGIN) == 1


def test_the_peer_finds_rllibs_nested_metrics():
    result = {"env_runners": {"episode_return_mean": 20.5,
                              "num_env_steps_sampled_lifetime": 4000},
              "learners": {"default_policy": {"total_loss": 1.0}}}
    assert rllib_peer._find(result, "episode_return_mean") == 20.5
    assert rllib_peer._find(result, "num_env_steps_sampled_lifetime") == 4000
    assert rllib_peer._find(result, "missing") is None
