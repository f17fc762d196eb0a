"""benchmarks/off_policy.py: the FLOP count of an update against a hand count, and a brief
measurement of pendulum_sac with small networks (no timing is asserted)."""

import types

import keras
import pytest

from batchrl import configs
from benchmarks import off_policy

# Without XLA for the update: its compilation is not what is measured here.
SMALL = {"policy_layers": [64, 64], "value_layers": [64, 64], "batch_size": 32,
         "replay_capacity": 1000, "jit_update": False}


@pytest.fixture(scope="module")
def result():
    config = configs.load("pendulum_sac", SMALL)
    return off_policy.measure(config, updates=3, repeats=1, fill=500)


def test_update_flops_of_sac_by_hand(result):
    # Pendulum: 3 observations, 1 action. Actor 3-64-64-(mean, log_std); each Q 4-64-64-1.
    actor = 3 * 64 + 64 * 64 + 2 * 64
    critic = 2 * (4 * 64 + 64 * 64 + 64)
    assert result["update_gflop"] * 1e9 == pytest.approx(2 * 32 * (4 * actor + 6 * critic))


def test_update_flops_of_a_convolutional_dqn_by_hand():
    """A convolution counts once per output position, not once per image."""
    q_network = keras.Sequential([keras.Input((10, 10, 3)), keras.layers.Conv2D(4, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(5)])
    algo = types.SimpleNamespace(name="dqn", networks=types.SimpleNamespace(policy=q_network),
                                 _observ_shape=(10, 10, 3))
    # 3x3 convolution of 3 channels to 4 on 10x10: 8x8 outputs, each with a bias; dense
    # 256 -> 5. Two FLOPs per multiply-add, one per bias addition.
    forward = 2 * 8 * 8 * 9 * 3 * 4 + 8 * 8 * 4 + 2 * 256 * 5 + 5
    assert off_policy.update_flops(algo, 32) == 5 * 32 * forward


def test_memory_figures_and_rates(result, capsys):
    # observation and next observation (3 float32 each), action, reward, discount.
    assert result["bytes_per_transition"] == 4 * (3 + 3 + 1 + 1 + 1)
    assert result["memory_bytes"] >= 1000 * result["bytes_per_transition"]
    assert result["updates_per_second"] > 0 and result["matmul_gflops"] > 0
    assert result["ratio"] == pytest.approx(
        result["update_gflops"] / result["matmul_gflops"])
    lines = off_policy.report(result).splitlines()
    assert lines[0].startswith("sac, batch 32:") and "bytes per transition" in lines[-1]
