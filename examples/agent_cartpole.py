"""Trains CartPole with batchrl.Agent from the application's own loop (8 Gymnasium envs).

Usage: python examples/agent_cartpole.py [STEPS [SEED]]; stops once the eval return reaches 475.
"""
import sys

import gymnasium as gym
import numpy as np

import batchrl

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
# SAME_STEP: a step that ends an episode returns the next episode's first observation and
# puts the final one into info["final_obs"] (the default NEXT_STEP spends a step on resets).
mode = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
envs = gym.make_vec("CartPole-v1", 8, vectorization_mode="sync", vector_kwargs=mode)
# max_length: the longest episode of these environments (CartPole-v1's time limit, 500).
agent = batchrl.Agent.create("cartpole", envs.single_observation_space,
                             envs.single_action_space, num_envs=8, seed=seed,
                             max_length=envs.spec.max_episode_steps)


def evaluate():
    """Mean return of the first episode of 8 environments, with the mean action."""
    eval_envs = gym.make_vec("CartPole-v1", 8, vectorization_mode="sync", vector_kwargs=mode)
    observation, _ = eval_envs.reset(seed=seed + 1000)
    agent.reset()  # New episodes in all 8 (the training episodes in progress end here).
    score, first = np.zeros(8), np.full(8, np.nan)
    while np.isnan(first).any():
        action = agent.act(observation, deterministic=True)
        observation, reward, terminated, truncated, _ = eval_envs.step(action)
        agent.observe(reward, terminated, truncated)  # Records nothing: no final needed.
        score += reward
        ended = (terminated | truncated) & np.isnan(first)
        first[ended] = score[ended]
    return first.mean()


observation, _ = envs.reset(seed=seed)
while agent.step < steps:
    action = agent.act(observation)
    observation, reward, terminated, truncated, info = envs.step(action)
    final = observation.copy()  # The observation after the step, before any reset.
    if "final_obs" in info:
        final[info["_final_obs"]] = np.stack(info["final_obs"][info["_final_obs"]])
    agent.observe(reward, terminated, truncated, final_observation=final)
    if agent.step % 10_000 == 0:
        score = evaluate()
        print(f"step {agent.step:,}: eval return {score:.1f}", flush=True)
        if score >= 475:
            break
agent.close()
