"""Registers the games of MinAtar (Young and Tian, arXiv:1903.03176) with Gymnasium when
imported, so that a config names them as `batchrl.environments.minatar:MinAtar/Breakout-v1`
(also `Asterix`, `Freeway`, `Seaquest`, `SpaceInvaders`; `-v1` with the game's minimal
action set, `-v0` with all 6 actions). Observations are bool `[10, 10, channels]` frames
(uint8 in the batch). Needs the package `minatar`.
"""

import gymnasium as gym
import minatar.gym

if "MinAtar/Breakout-v1" not in gym.registry:
    minatar.gym.register_envs()
