"""benchmarks/conv.py: the forward pass's FLOP count against a hand count (a shared torso
counted once), and a brief measurement on MinAtar SpaceInvaders (no timing is asserted)."""

import gymnasium as gym
import numpy as np
import pytest

from batchrl import configs, networks
from benchmarks import conv

CONV = [{"type": "conv2d", "filters": 4, "kernel": 3}, {"type": "flatten"},
        {"type": "dense", "units": 8}]


@pytest.mark.parametrize("share", [True, False])
def test_forward_flops_by_hand(share):
    space = gym.spaces.Box(0, 255, (10, 10, 3), np.uint8)
    config = configs.load("default", {"network": CONV, "share_layers": share})
    built = networks.constructor(config.network)(space, gym.spaces.Discrete(3), config)
    # 3x3 convolution of 3 channels to 4 on 10x10: 8x8 outputs; dense 256 -> 8; logits
    # 8 -> 3; value 8 -> 1. Two FLOPs per multiply-add, one per bias addition.
    torso = 2 * (8 * 8 * 9 * 3 * 4 + 256 * 8) + (8 * 8 * 4 + 8)
    heads = 2 * (8 * 3 + 8) + (3 + 1)
    assert conv.forward_flops(built, space.shape) == (1 if share else 2) * torso + heads


def test_measures_a_convolutional_ppo_step(capsys):
    assert conv.main(["--config", "minatar_space_invaders", "--set", "num_agents=2",
                      "--set", "batch_size=16", "--steps", "2", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("minibatch step (separate layers, batch 16): ")
    assert "GFLOP/s; matmul chain: " in lines[1] and " ratio " in lines[1]
    assert lines[2].startswith("minibatch steps alone (4 epochs): ")
