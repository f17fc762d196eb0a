"""The acting half of an algorithm (`batchrl.algorithms.actor`) built alone, without
optimizers or memories: given a trained algorithm's weights (normalizer statistics
included) it acts as the algorithm does."""

import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl.algorithms.base import Algorithm
from tests.agent_fixtures import Feed, make_agent, play

OBSERVATION = spaces.Box(-np.inf, np.inf, (3,), np.float32)
SETTINGS = {
    "ppo": ({"policy_layers": [8], "value_layers": [8], "update_every": 2,
             "update_epochs": 1, "max_length": 10}, spaces.Box(-1.0, 1.0, (2,), np.float32)),
    "sac": ({"algorithm": "sac", "policy_layers": [8], "value_layers": [8], "batch_size": 4,
             "learning_starts": 4, "replay_capacity": 64, "max_length": 10,
             "normalize_observ": True}, spaces.Box(-1.0, 1.0, (2,), np.float32)),
    "dqn": ({"algorithm": "dqn", "value_layers": [8], "policy_layers": [8], "batch_size": 4,
             "learning_starts": 4, "replay_capacity": 64, "max_length": 10,
             "normalize_observ": True}, spaces.Discrete(3)),
    "td3": ({"algorithm": "td3", "policy_layers": [8], "value_layers": [8], "batch_size": 4,
             "learning_starts": 4, "replay_capacity": 64, "max_length": 10,
             "normalize_observ": True}, spaces.Box(-1.0, 1.0, (2,), np.float32)),
    **{name: ({"algorithm": name, "policy_layers": [8], "value_layers": [8],
               "update_every": 2, "max_length": 10, "network": "feed_forward_categorical"},
              spaces.Discrete(3))
       for name in ("trpo", "a2c")},
    "pqn": ({"algorithm": "pqn", "policy_layers": [8], "rollout_length": 4,
             "max_length": 10, "network": "feed_forward_categorical", "update_epochs": 1},
            spaces.Discrete(3)),
    **{name: ({"algorithm": name, "policy_layers": [8], "value_layers": [8],
               "rollout_length": 4, "max_length": 10}, spaces.Box(-1.0, 1.0, (2,), np.float32))
       for name in ("impala", "appo")},
}


def test_every_algorithm_of_the_registry_is_tried():
    from batchrl.algorithms import registry

    assert sorted(SETTINGS) == sorted(registry.NAMES)


@pytest.mark.parametrize("algorithm", sorted(SETTINGS))
def test_an_actor_built_alone_acts_as_the_trained_algorithm(algorithm):
    config, action_space = SETTINGS[algorithm]
    agent = make_agent(num_envs=2, observation_space=OBSERVATION, action_space=action_space,
                       config=config)
    algo = agent._algo
    assert isinstance(algo, Algorithm)
    actor = algo.actor
    before = actor.get_weights()
    play(agent, Feed(2, seed=1), 8)  # Two updates of PPO; several of SAC and DQN.
    weights = actor.get_weights()
    assert all(isinstance(array, np.ndarray) for array in weights)
    # Training changed the policy and the observation statistics.
    assert any(not np.array_equal(old, new) for old, new in zip(before, weights, strict=True))

    # An off-policy acting half alone builds its critic too (an Ape-X actor's).
    assert type(actor) is type(algo).actor_class
    options = {"critic": True} if hasattr(actor, "critic") else {}
    alone = type(actor)(algo._batch_env.observation_space, algo._batch_env.action_space,
                        algo._config, **options)
    observ = tf.constant(np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32))
    state = tf.zeros([5, algo.state_size])
    fresh, _ = alone.act(observ, state, explore=False)
    alone.set_weights(weights)
    for copied, trained in zip(alone.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(copied, trained)
    action, _ = alone.act(observ, state, explore=False)
    expected, _ = algo.policy_action(observ, state)
    np.testing.assert_array_equal(action.numpy(), expected.numpy())
    # The copy is what makes them equal: the fresh actor's own weights act otherwise.
    assert not np.array_equal(fresh.numpy(), expected.numpy())


def test_set_weights_refuses_arrays_of_another_actor():
    config, action_space = SETTINGS["ppo"]
    algo = make_agent(num_envs=2, observation_space=OBSERVATION, action_space=action_space,
                      config=config)._algo
    weights = algo.actor.get_weights()
    with pytest.raises(ValueError, match="arrays for the"):
        algo.actor.set_weights(weights[:-1])
    with pytest.raises(ValueError, match="of shape"):
        algo.actor.set_weights([np.zeros((1, 1), np.float32)] + weights[1:])


def test_every_shipped_algorithm_subclasses_the_contract_and_learns_from_a_batch():
    """PPO (recurrent too: the same class), TRPO, A2C, SAC, TD3, DQN and the REINFORCE of
    examples/reinforce.py (`build_algorithm`) subclass `Algorithm` and define their own
    `update(batch)` and acting half; none is abstract."""
    import inspect

    from batchrl import build
    from examples.reinforce import REINFORCE

    for cls in [*build.ALGORITHMS.values(), REINFORCE]:
        assert issubclass(cls, Algorithm), cls
        assert not inspect.isabstract(cls), (cls, cls.__abstractmethods__)
        assert cls.update is not Algorithm.update, cls
        assert list(inspect.signature(cls.update).parameters) == ["self", "batch"], cls
