"""Episodes cut short (a phase switch of the training loop, the Agent's deterministic `act`
or `reset`) leave no step behind in the replay memory's n-step windows: the waiting steps
are stored as a truncated episode's, bootstrapped from the last next observation."""

import gymnasium as gym
import numpy as np
import tensorflow as tf

import batchrl
from batchrl import configs
from batchrl.algorithms.sac import SAC
from batchrl.drivers.loop import step_function
from batchrl.memories.replay import FIELDS
from batchrl.native_tasks import Pendulum
from tests.memories.test_replay import NumpyReplay

N_STEP, DISCOUNT = 3, 0.9
# No update runs (learning_starts is never reached): only what is stored matters here.
SMALL = {"policy_layers": [8], "value_layers": [8], "n_step": N_STEP,
         "discount": DISCOUNT, "replay_capacity": 1000, "learning_starts": 1000}


def test_the_loops_phase_switches_store_every_training_step():
    """The loop's step function on 4 in-graph Pendulums of 20-step episodes: each phase
    begins with a forced reset, which stores the steps a training phase left in the
    windows and no step of an evaluation phase. Every training step becomes one
    transition. (Under XLA: test_replay.py::test_jit_matches_eager.)"""
    agents = 4
    env = Pendulum(agents, max_episode_steps=20, seed=0)
    is_training = tf.Variable(True)
    algo = SAC(env, tf.Variable(0, dtype=tf.int64), is_training, tf.Variable(False),
               configs.load("default", {"algorithm": "sac", **SMALL}))
    function = step_function(env, algo, steps_per_call=25)

    def size():
        return int(algo.memory.size.numpy())

    def phase(training, steps):
        is_training.assign(training)
        function(tf.constant(False), tf.constant(True), tf.constant(steps))

    phase(True, 10)
    assert size() == agents * (10 - (N_STEP - 1))  # The last 2 steps of each still wait.
    last_nextob = env.observ.numpy().copy()
    phase(False, 5)  # Train -> eval: the forced reset stores the waiting steps.
    assert size() == agents * 10
    # The last 8 rows: agent by agent, its two waiting steps, truncated after the second
    # (discount^2, discount), bootstrapping from the observation after it.
    rows = slice(agents * 10 - 2 * agents, agents * 10)
    np.testing.assert_allclose(algo.memory.storage["nextob"][rows].numpy(),
                               np.repeat(last_nextob, 2, axis=0))
    np.testing.assert_allclose(algo.memory.storage["discount"][rows].numpy(),
                               [DISCOUNT ** 2, DISCOUNT] * agents, rtol=1e-6)
    phase(True, 25)  # Eval -> train: nothing waited; an episode ends at its 20th step.
    assert size() == agents * (10 + 25 - (N_STEP - 1))
    phase(False, 5)
    phase(False, 5)  # Eval -> eval: nothing to store.
    assert size() == agents * (10 + 25)


def _rows(memory, count):
    return {key: memory.storage[key].numpy()[:count] for key in FIELDS if key != "action"}


def test_the_agents_cut_episodes_store_every_sampled_step():
    """Sampled steps, a deterministic step, sampled steps, `reset`, a sampled step, through
    `batchrl.Agent` with SAC: the memory holds what a NumPy n-step reference that ends the
    cut episodes as truncated holds (returns, discount^k, the last final observation as
    the next observation), one transition per sampled step once the windows are flushed."""
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    agent = batchrl.Agent.create("pendulum_sac", space, gym.spaces.Box(-2.0, 2.0, (1,)),
                                 num_envs=2, max_length=50, **SMALL)
    reference = NumpyReplay(1000, 2, N_STEP, DISCOUNT)
    rng = np.random.default_rng(0)
    agents = np.arange(2)
    sampled = 0

    def step(terminated=(False, False), deterministic=False):
        nonlocal sampled
        observation = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
        action = agent.act(observation, deterministic=deterministic)
        reward = rng.normal(size=2).astype(np.float32)
        final = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
        agent.observe(reward, np.array(terminated), np.zeros(2, bool),
                      final_observation=final)
        if not deterministic:
            sampled += 1
            reference.add(agents, observation, action, reward, terminated, (False, False),
                          final)

    for terminated in [(False, False), (False, True), (False, False), (False, False)]:
        step(terminated)
    # A cut episode is stored at the next sampled act, before its step: nothing is written
    # in between, so the reference stores it at the cut.
    step(deterministic=True)  # Ends both training episodes in progress.
    reference.flush(agents)
    step()
    step()
    agent.reset([1])
    reference.flush([1])
    step()
    agent.reset()
    reference.flush(agents)
    step(deterministic=True)
    step()
    memory = agent._algo.memory
    count = int(memory.size.numpy())
    assert count == reference.size == 2 * (sampled - 1)  # The last step still waits.
    expected = {key: np.stack(reference.rows[key][:count]) for key in FIELDS
                if key != "action"}
    for key, stored in _rows(memory, count).items():
        np.testing.assert_allclose(stored, expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
