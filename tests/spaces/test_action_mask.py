"""Action masking: a `Dict` observation's `action_mask` entry masks the logits of a
`Discrete` or `MultiDiscrete` action when acting, in the loss and in the exported model."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import batchrl
from batchrl import configs, networks
from batchrl.environments.nested_tasks import MaskedChoice
from batchrl.spaces.nested import FlatActionSpace, FlatObservationSpace

SPACE = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(4),
                         "position": gym.spaces.Box(-5.0, 5.0, (3,), np.float32)})


def _policy(network="feed_forward_categorical", actions=4):
    config = configs.load("default", {"policy_layers": [16], "value_layers": [16],
                                      "network": network})
    flat = FlatObservationSpace(SPACE)
    return networks.constructor(config.network)(flat, gym.spaces.Discrete(actions), config)


def test_the_mask_is_located_in_the_flat_observation_and_never_normalized():
    flat = FlatObservationSpace(SPACE)
    assert flat.action_mask == (0, 4)  # Gymnasium sorts a Dict's keys.
    np.testing.assert_array_equal(flat.normalize, [False] * 4 + [True] * 3)
    assert FlatObservationSpace(gym.spaces.Dict({"position": SPACE["position"]})).action_mask \
        is None


@pytest.mark.parametrize("network", [
    "feed_forward_categorical", [{"type": "dense", "units": 16}]])
def test_masked_actions_are_never_sampled_and_the_rest_keep_all_the_probability(network):
    built = _policy(network)
    masks = np.array([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 0]], np.float32)
    observ = np.concatenate([masks, np.random.default_rng(0).normal(size=(3, 3))], 1)
    params, _ = built.policy(observ[:, None].astype(np.float32), np.zeros((3, 0), np.float32))
    distribution = built.distribution({key: value[:, 0] for key, value in params.items()})
    repeated = built.distribution({key: tf.tile(value[:, 0], [2000, 1])
                                   for key, value in params.items()})
    draws = repeated.sample(tf.random.Generator.from_seed(0)).numpy().reshape(2000, 3)
    assert masks[np.arange(3), draws].all(), "a masked action was sampled"
    for row in range(3):  # Every allowed action is drawn: the mask removes only the others.
        assert set(np.unique(draws[:, row])) == set(np.flatnonzero(masks[row]))
    assert masks[np.arange(3), distribution.mode().numpy()].all()
    log_prob = np.stack([distribution.log_prob(tf.fill([3], action)).numpy()
                         for action in range(4)], 1)
    np.testing.assert_allclose(np.exp(log_prob).sum(1), 1.0, rtol=1e-5)
    assert np.isfinite(log_prob).all() and np.isfinite(distribution.entropy().numpy()).all()
    np.testing.assert_array_equal(np.exp(log_prob)[masks == 0], 0.0)


def test_a_mask_that_does_not_fit_the_actions_is_an_error():
    with pytest.raises(ValueError, match="action_mask has 4 elements, the Discrete action "
                                         "space 5 actions"):
        _policy(actions=5)


def test_a_mask_with_a_box_action_space_is_an_error():
    config = configs.load("default", {"policy_layers": [16], "value_layers": [16]})
    with pytest.raises(ValueError, match="action_mask needs a Discrete or MultiDiscrete"):
        networks.feed_forward_gaussian(FlatObservationSpace(SPACE),
                                       gym.spaces.Box(-1, 1, (4,), np.float32), config)


def test_the_agent_and_its_exported_model_never_take_a_masked_action(tmp_path):
    env = MaskedChoice(n=4)
    agent = batchrl.Agent.create(
        "masked_choice", env.observation_space, env.action_space, num_envs=8, seed=0,
        update_every=4, update_epochs=2)
    envs = [MaskedChoice(n=4) for _ in range(8)]
    observations = [e.reset(seed=index)[0] for index, e in enumerate(envs)]
    batch = {key: np.stack([o[key] for o in observations]) for key in observations[0]}
    for step in range(60):  # Strict environments: a masked action raises.
        action = agent.act(batch)
        results = [e.step(a) for e, a in zip(envs, action, strict=True)]
        batch = {key: np.stack([r[0][key] for r in results]) for key in results[0][0]}
        agent.observe([r[1] for r in results], np.zeros(8, bool),
                      np.full(8, step % 20 == 19), final_observation=batch)
    expected = agent.act(batch, deterministic=True)
    assert batch["action_mask"][np.arange(8), expected].all()
    model = tf.saved_model.load(str(agent.export(tmp_path / "model")))
    served = model.signatures["serving_default"](
        observation_action_mask=tf.constant(batch["action_mask"]),
        observation_values=tf.constant(batch["values"]))["action"].numpy()
    np.testing.assert_array_equal(served, expected)
    agent.close()


@pytest.mark.parametrize("network", [
    "feed_forward_composite", [{"type": "dense", "units": 16}]])
def test_each_choice_of_a_multidiscrete_action_keeps_to_its_mask(network):
    # MultiDiscrete([3, 1]): the mask holds the first choice's 3 elements, then the
    # second's 1 (4 in all, as SPACE's mask).
    config = configs.load("default", {"policy_layers": [16], "value_layers": [16],
                                      "network": network})
    actions = FlatActionSpace(gym.spaces.MultiDiscrete([3, 1]))
    built = networks.constructor(config.network)(FlatObservationSpace(SPACE), actions, config)
    masks = np.array([[0, 1, 1, 1], [1, 0, 0, 1]], np.float32)
    observ = np.concatenate([masks, np.zeros((2, 3), np.float32)], 1)[:, None]
    params, _ = built.policy(observ, np.zeros((2, 0), np.float32))
    repeated = built.distribution({key: tf.tile(value[:, 0], [1000, 1, 1])
                                   for key, value in params.items()})
    draws = repeated.sample(tf.random.Generator.from_seed(0)).numpy().reshape(1000, 2, 2)
    first = draws[..., 0].astype(int)
    assert set(np.unique(first[:, 0])) == {1, 2} and set(np.unique(first[:, 1])) == {0}
    np.testing.assert_array_equal(draws[..., 1], 0)
    # Probability 0 for the masked actions, 1 in all for each choice.
    probabilities = tf.nn.softmax(params["leaf0_logits"][:, 0]).numpy()
    np.testing.assert_array_equal(probabilities[0, 0, 0], 0.0)
    np.testing.assert_array_equal(probabilities[1, 0, 1:], 0.0)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-6)


def test_a_multidiscrete_mask_must_cover_every_choice():
    config = configs.load("default", {"policy_layers": [16], "value_layers": [16]})
    with pytest.raises(ValueError, match=r"MultiDiscrete action space \[3, 2\] \(their sum\) 5"):
        networks.feed_forward_composite(FlatObservationSpace(SPACE), FlatActionSpace(
            gym.spaces.MultiDiscrete([3, 2])), config)


def test_dqn_explores_and_acts_within_the_mask():
    """Strict MaskedChoice environments raise on a forbidden action: random exploration and
    greedy actions (epsilon 0.5: half of each) both keep to the masks while DQN trains."""
    from batchrl import build, environments
    from batchrl.drivers.simulate import simulate

    config = configs.load("default", {
        "algorithm": "dqn", "env": "batchrl.environments.nested_tasks:MaskedChoice",
        "env_backend": "local", "num_agents": 4, "max_length": 20, "value_layers": [16],
        "batch_size": 8, "learning_starts": 8, "replay_capacity": 200, "normalize_observ": False,
        "exploration": {"type": "epsilon_decay", "initial": 0.5, "final": 0.5, "steps": 1}})
    batch_env = environments.create_batch(config)
    try:
        built = build.build(config, batch_env, process_eager=False)

        @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
        def run(log, reset):
            return simulate(built.batch_env, built.algo, log, reset)

        for _ in range(60):
            run(False, False)
        assert int(built.algo.updates.numpy()) > 0
        # The exported `sample` signature draws its random actions within the masks too.
        observ = np.concatenate([np.eye(4, 5, k=1), np.zeros((4, 5))], 1).astype(np.float32)
        draws = [built.algo.policy_action(observ, None, tf.random.Generator.from_seed(seed))[0]
                 for seed in range(20)]
        np.testing.assert_array_equal(np.stack(draws), np.tile(np.arange(1, 5), (20, 1)))
    finally:
        batch_env.close()
