"""PPO on fixed-length rollouts (`rollout_length`) and on image observations kept as uint8,
inside `simulate`, on MockEnvironment batches, and through `batchrl.Agent`."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from batchrl import Agent, configs, networks
from batchrl.algorithms.ppo import PPO
from batchrl.drivers.simulate import episode_state, simulate
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment

CONV = [{"type": "conv2d", "filters": 4, "kernel": 3, "stride": 2}, {"type": "flatten"},
        {"type": "dense", "units": 16}]


def _setup(durations, observ_shape=(3,), truncate=False, **overrides):
    """PPO on rollouts of 8 steps in `simulate` over MockEnvironments of episodes of
    `durations` steps (`(low, high)` each); `truncate`: whether their episodes end
    truncated, for all or per environment."""
    tf.keras.utils.set_random_seed(0)  # The same initial weights in every run.
    truncates = truncate if isinstance(truncate, list) else [truncate] * len(durations)
    kwargs = {}
    if len(observ_shape) == 3:
        kwargs = {"observ_dtype": np.uint8, "num_actions": 3}
        overrides = {"network": CONV, "preprocessing": [{"type": "scale"}],
                     "normalize_observ": False, **overrides}
    envs = [MockEnvironment(observ_shape, () if kwargs else (2,), low, high,
                            truncate=cut, **kwargs)
            for (low, high), cut in zip(durations, truncates, strict=True)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    config = configs.load("default", {"policy_layers": [16], "value_layers": [16],
                                      "update_epochs": 2, "rollout_length": 8, **overrides})
    config.update(network=networks.constructor(config.network), max_length=20)
    algo = PPO(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
               tf.Variable(False), config)
    episode_state(batch_env)  # Its variables exist before the trace: one trace, not two.

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    return batch_env, algo, run


@pytest.fixture(scope="module")
def filled():
    """Agent 0's episodes of 3 steps are truncated, agent 1's of 5 terminate; observations
    are not normalized. What 7 calls stored (`memory`: the rollouts' fields, `next_value`
    of `_memory_batch`), the observation after each step (`finals`, `[agents, 7, 3]`), the
    value network's values of those and of the observations acted on (`value_next`,
    `value_observ`), the policy's weights before (`initial`), after the 7th call (`before`)
    and after the 8th (`after`), and the rows' lengths after it (`length_after`)."""
    batch_env, algo, run = _setup([(3, 3), (5, 5)], truncate=[True, False],
                                  normalize_observ=False)
    policy = algo.networks.policy.trainable_variables
    result = {"initial": [v.numpy().copy() for v in policy]}
    finals = []
    for _ in range(7):
        run(False, False)
        finals.append(batch_env.observ.numpy().copy())
    finals = np.stack(finals, 1)
    value = algo.networks.value
    memory = {key: field.numpy().copy() for key, field in algo._memory.fields.items()}
    result.update(
        finals=finals, memory=memory, length=algo._memory.length.numpy(),
        next_value=algo._memory_batch()["next_value"].numpy()[:, :7],
        value_next=value(tf.constant(finals)).numpy(),
        value_observ=value(tf.constant(memory["observ"][:, :7])).numpy(),
        before=[v.numpy().copy() for v in policy])
    run(False, False)  # The 8th step fills both rows: the update runs and empties them.
    result.update(length_after=algo._memory.length.numpy(),
                  after=[v.numpy().copy() for v in policy])
    return result


def test_rollouts_hold_each_agents_steps_across_its_episode_ends(filled):
    memory = filled["memory"]
    np.testing.assert_array_equal(filled["length"], [7, 7])
    done = memory["done"][:, :7]
    np.testing.assert_array_equal(done[0], [0, 0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(done[1], [0, 0, 0, 0, 1, 0, 0])
    # Agent 0's episodes were truncated, agent 1's terminated.
    np.testing.assert_array_equal(memory["terminated"][:, :7], done * [[0], [1]])
    # The observation after each step: the final one where an episode ended, the next
    # step's observation elsewhere.
    next_observ, observ = memory["next_observ"], memory["observ"]
    np.testing.assert_array_equal(next_observ[:, :7], filled["finals"])
    np.testing.assert_array_equal(next_observ[0, [0, 1, 3, 4]], observ[0, [1, 2, 4, 5]])
    assert not np.allclose(observ[0, 3], next_observ[0, 2])  # A new episode began.


def test_next_value_is_the_value_of_the_observation_after_each_step(filled):
    """The bootstrap value of a rollout's step is V(s') of the observation after it: the
    final observation where an episode ended (not the next episode's first one) and at the
    row's cut, computed here with the value network on the observations seen."""
    next_value = filled["next_value"]
    np.testing.assert_allclose(next_value, filled["value_next"], rtol=1e-5, atol=1e-6)
    # Agent 0's episodes end after steps 2 and 5: its final observations' values are not
    # those of the next episodes' first observations (steps 3 and 6), nor is the value at
    # the cut (step 6) that of the observation step 6 was taken in.
    current = filled["value_observ"][0]
    for step, other in ((2, 3), (5, 6), (6, 6)):
        assert abs(next_value[0, step] - current[other]) > 1e-4, step


def test_the_update_runs_once_every_agent_filled_its_rollout(filled):
    assert all(np.array_equal(a, b)
               for a, b in zip(filled["initial"], filled["before"], strict=True))
    np.testing.assert_array_equal(filled["length_after"], [0, 0])  # Emptied by the update.
    assert any(not np.allclose(a, b)
               for a, b in zip(filled["initial"], filled["after"], strict=True))


def test_trains_without_crash_on_observations_of_two_axes():
    # Images (9, 9, 3): the shared-layer tests; (1,) and (2, 3, 4): tests/algorithms/test_ppo.py.
    batch_env, algo, run = _setup([(1, 12), (3, 5), (2, 9)], (2, 3), chunk_length=1,
                                  batch_size=5)
    assert batch_env.observ.dtype == algo._memory.fields["observ"].dtype == tf.float32
    before = [v.numpy().copy() for v in algo.networks.value.trainable_variables]
    for _ in range(20):
        done, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
    after = algo.networks.value.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))


def test_rollouts_refuse_a_recurrent_policy():
    with pytest.raises(ValueError, match="rollout_length needs a feed-forward policy"):
        _setup([(3, 3)], network="recurrent_gaussian")


def _op_count(function, op_type):
    """How many ops of `op_type` the traced `function` holds, its loops' bodies included."""
    graph = function.get_concrete_function().graph.as_graph_def()
    nodes = list(graph.node) + [node for library_function in graph.library.function
                                for node in library_function.node_def]
    return sum(node.op == op_type for node in nodes)


@pytest.mark.parametrize("share", [False, True])
def test_shared_layers_run_once_in_one_joint_step(share):
    """Image observations (uint8 frames of (9, 9, 3), three actions) through a declared
    convolution, with a torso for each network or one for both."""
    batch_env, algo, run = _setup([(1, 12), (3, 5)], (9, 9, 3), share_layers=share,
                                  chunk_length=1, batch_size=5)
    assert batch_env.observ.dtype == algo._memory.fields["observ"].dtype == tf.uint8
    state = algo.checkpoint_state
    assert ("value_optimizer" in state) is not share
    # The convolution's kernel gradient: once per minibatch step with one torso for both
    # losses, once per network with a torso each.
    assert _op_count(algo._update, "Conv2DBackpropFilter") == (1 if share else 2)
    variables = {"policy": algo.networks.policy.trainable_variables,
                 "value": algo.networks.value.trainable_variables}
    before = {key: [v.numpy().copy() for v in value] for key, value in variables.items()}
    for _ in range(12):
        _, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
    for key, values in variables.items():  # Every kernel and bias of both networks trained.
        for old, new in zip(before[key], values, strict=True):
            assert not np.allclose(old, new.numpy()), new.path
    # Raw frames: nothing went through the observation normalizer.
    assert int(state["observ_filter"].count) == 0


def test_value_coef_weighs_the_value_loss_in_the_joint_step():
    _, algo, run = _setup([(1, 12), (3, 5)], (9, 9, 3), share_layers=True, value_coef=0.0)
    head = algo.networks.value.trainable_variables[-2:]  # The value output layer.
    before = [v.numpy().copy() for v in head]
    policy_before = algo.networks.policy.trainable_variables[-1].numpy().copy()
    for _ in range(12):
        run(False, False)
    assert not np.allclose(policy_before, algo.networks.policy.trainable_variables[-1].numpy())
    for old, new in zip(before, head, strict=True):  # No gradient: Adam leaves it as it was.
        np.testing.assert_array_equal(old, new.numpy())


def test_a_forced_reset_ends_the_cut_episode_and_the_clipped_surrogate_trains():
    """A forced reset (a new phase) ends every agent's episode in progress, as truncated.
    With `clip_ratio`, the update trains on the clipped surrogate without the KL terms."""
    _, algo, run = _setup([(10, 10), (10, 10)], clip_ratio=0.2)
    before = [v.numpy().copy() for v in algo.networks.policy.trainable_variables]
    for _ in range(3):
        run(False, False)
    run(False, True)  # A new phase: every agent begins a new episode.
    memory = algo._memory.fields
    np.testing.assert_array_equal(memory["done"].numpy()[:, :4], [[0, 0, 1, 0]] * 2)
    np.testing.assert_array_equal(memory["terminated"].numpy()[:, :4], 0)
    for _ in range(3):
        run(False, False)
    result = algo._update()  # On the 7 steps of each row so far.
    after = algo.networks.policy.trainable_variables
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))
    assert float(result["policy_loss"]) == pytest.approx(float(result["surrogate"]))
    assert float(result["kl"]) > 0  # Measured still, for the summaries.
    assert "kl_penalty" not in result and "kl_target" not in result
    assert float(algo.checkpoint_state["kl_penalty"].numpy()) == 1.0  # Not adapted.


def test_a_row_that_falls_behind_trains_with_the_others():
    """An Agent environment dropped for passing `max_length` leaves its row a step behind;
    with `chunk_length` dividing `rollout_length` the memory has no spare step, so the
    update runs once the first row is full, the short row with the steps it has."""
    agent = Agent.create("cartpole", gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                         gym.spaces.Discrete(2), num_envs=2, rollout_length=4,
                         chunk_length=1, max_length=5, policy_layers=[8], value_layers=[8],
                         update_epochs=1)
    rng = np.random.default_rng(0)
    algo = agent._algo
    lengths, updated = [], []
    for t in range(13):  # Environment 0 never ends, environment 1 ends every 3 steps.
        weights = algo.networks.value.trainable_variables[0].numpy().copy()
        agent.act(rng.normal(size=(2, 4)))
        step = (np.ones(2), [False, t % 3 == 2], [False, False], rng.normal(size=(2, 4)))
        if t in (5, 11):  # Environment 0's sixth step passes max_length: it is dropped.
            with pytest.raises(ValueError, match=r"environments \[0\] passed max_length=5"):
                agent.observe(*step)
        else:
            agent.observe(*step)
        lengths.append(algo._memory.length.numpy().tolist())
        updated.append(not np.array_equal(
            weights, algo.networks.value.trainable_variables[0].numpy()))
    # Rows fill in step until the drop; from then on row 0 is one step behind row 1.
    assert lengths == [[1, 1], [2, 2], [3, 3], [0, 0], [1, 1], [1, 2], [2, 3], [0, 0],
                       [1, 1], [2, 2], [3, 3], [0, 0], [1, 1]]
    assert updated == [t in (3, 7, 11) for t in range(13)]
