"""DQN on CartPole that starts from logged data: transitions played elsewhere (here by a
random policy) go into the replay memory with Agent.update(batch), and the agent learns from
them before it acts; then it learns from its own play.

Usage: python examples/dqn_logged_data.py [STEPS [SEED]]; prints the eval return after the
logged data and every 4,000 steps of its own, up to STEPS (default 40,000) or 475.
"""
import sys

import gymnasium as gym
import numpy as np

import batchrl

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
mode = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
envs = gym.make_vec("CartPole-v1", 8, vectorization_mode="sync", vector_kwargs=mode)
agent = batchrl.Agent.create("cartpole_dqn", envs.single_observation_space,
                             envs.single_action_space, num_envs=8, seed=seed,
                             max_length=envs.spec.max_episode_steps)


def play(policy, count):
    """`count` steps of the 8 environments under `policy(observation) -> action`; returns
    the transitions as the dict `Agent.update` takes."""
    observation, _ = envs.reset(seed=seed)
    batch = {key: [] for key in ("observation", "action", "reward", "terminated",
                                 "next_observation")}
    for _ in range(count):
        action = policy(observation)
        next_observation, reward, terminated, truncated, info = envs.step(action)
        final = next_observation.copy()  # The observation after the step, before a reset.
        if "final_obs" in info:
            final[info["_final_obs"]] = np.stack(info["final_obs"][info["_final_obs"]])
        for key, value in zip(batch, (observation, action, reward, terminated, final),
                              strict=True):
            batch[key].append(value)
        observation = next_observation
    return {key: np.concatenate(value) for key, value in batch.items()}


def evaluate():
    """Mean return of one episode in each of 8 environments, with the greedy action."""
    eval_envs = gym.make_vec("CartPole-v1", 8, vectorization_mode="sync", vector_kwargs=mode)
    observation, _ = eval_envs.reset(seed=seed + 1000)
    agent.reset()
    score, first = np.zeros(8), np.full(8, np.nan)
    while np.isnan(first).any():
        action = agent.act(observation, deterministic=True)
        observation, reward, terminated, truncated, _ = eval_envs.step(action)
        agent.observe(reward, terminated, truncated)
        score += reward
        ended = (terminated | truncated) & np.isnan(first)
        first[ended] = score[ended]
    return first.mean()


rng = np.random.default_rng(seed)


def random_policy(observation):
    return rng.integers(0, 2, len(observation))


updates = agent.update(play(random_policy, 500))  # 4,000 logged transitions.
print(f"logged data: {updates} updates, eval return {evaluate():.1f}", flush=True)
observation, _ = envs.reset(seed=seed)
while agent.step < steps:
    action = agent.act(observation)
    observation, reward, terminated, truncated, info = envs.step(action)
    final = observation.copy()
    if "final_obs" in info:
        final[info["_final_obs"]] = np.stack(info["final_obs"][info["_final_obs"]])
    agent.observe(reward, terminated, truncated, final_observation=final)
    if agent.step % 4_000 == 0:
        score = evaluate()
        print(f"step {agent.step:,}: eval return {score:.1f}", flush=True)
        if score >= 475:
            break
agent.close()
