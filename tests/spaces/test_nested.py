"""Nested spaces as flat vectors: `batchrl.spaces.nested` (environment side, NumPy) and
`batchrl.spaces` (graph side), which must agree with each other and with Gymnasium."""

import pickle
import sys

import cloudpickle
import gymnasium
import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl import spaces as spaces_lib
from batchrl.environments.nested_tasks import DictPendulum, ReachAndChoose
from batchrl.environments.processes import ParallelBatchEnv
from batchrl.environments.wrappers import WorkerError, standard_wrappers
from batchrl.spaces import nested

cloudpickle.register_pickle_by_value(sys.modules[__name__])

OBSERVATION = spaces.Dict({
    "position": spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    "cue": spaces.Discrete(3, start=-1),
    "more": spaces.Tuple((spaces.MultiDiscrete([2, 3], start=[1, 0]), spaces.MultiBinary(2),
                          spaces.Box(-np.inf, np.inf, (1,), np.float64))),
})
ACTION = spaces.Dict({
    "move": spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32)),
    "free": spaces.Box(-np.inf, np.inf, (1,), np.float32),
    "kind": spaces.Discrete(3, start=1),
    "more": spaces.Tuple((spaces.MultiDiscrete([[2, 3]], start=[[0, 5]]),
                          spaces.MultiBinary(3))),
})


class SpacesEnv(gymnasium.Env):
    """Returns the observations it is given (`observations`, cycled); records actions."""

    def __init__(self, observation_space, action_space, observations=None):
        self.observation_space = observation_space
        self.action_space = action_space
        self.observations = observations or [observation_space.sample()]
        self.count = 0
        self.received = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._next(), {}

    def step(self, action):
        self.received.append(action)
        return self._next(), 0.0, False, False, {}

    def _next(self):
        self.count += 1
        return self.observations[(self.count - 1) % len(self.observations)]


def _samples(space, count, seed=0):
    space.seed(seed)
    return [space.sample() for _ in range(count)]


def _stack(space, samples):
    """A batch of `samples`, nested as `space` (the leaves stacked)."""
    if isinstance(space, spaces.Dict):
        return {key: _stack(sub, [s[key] for s in samples]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_stack(sub, [s[i] for s in samples]) for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(s) for s in samples])


def test_flat_observation_space_and_wrapper_flatten_as_gymnasium_does():
    flat = nested.FlatObservationSpace(OBSERVATION)
    # Leaves in the Dict's (sorted) key order: cue (3), more (2 + 3, 2, 1), position (6).
    assert flat.shape == (17,) and flat.dtype == np.float32
    np.testing.assert_array_equal(flat.normalize, [False] * 3 + [False] * 7 + [True] * 7)
    samples = _samples(OBSERVATION, 20)
    env = standard_wrappers(SpacesEnv(OBSERVATION, spaces.Discrete(2), samples))
    assert env.observation_space == flat
    assert env.observation_space != spaces.Box(flat.low, flat.high)  # The nesting counts.
    observ, _ = env.reset(seed=0)
    observs = [observ] + [env.step(0)[0] for _ in range(19)]
    for observ, sample in zip(observs, samples, strict=True):
        assert observ.dtype == np.float32
        np.testing.assert_allclose(observ, spaces.flatten(OBSERVATION, sample), rtol=1e-6)
    # The graph's flattening (Agent, SavedModel) gives the same batch.
    batch = nested.check_batch(OBSERVATION, _stack(OBSERVATION, samples), 20)
    graph = spaces_lib.to_policy_observation(
        tf.nest.map_structure(tf.constant, batch), OBSERVATION).numpy()
    np.testing.assert_allclose(graph, np.stack(observs), rtol=1e-6)


def test_a_discrete_observation_space_becomes_one_hot():
    env = standard_wrappers(SpacesEnv(spaces.Discrete(4), spaces.Discrete(2), [2]))
    observ, _ = env.reset(seed=0)
    np.testing.assert_array_equal(observ, [0, 0, 1, 0])
    assert not env.observation_space.normalize.any()
    graph = spaces_lib.to_policy_observation(tf.constant([2, 0]), spaces.Discrete(4))
    np.testing.assert_array_equal(graph.numpy(), [[0, 0, 1, 0], [1, 0, 0, 0]])


def test_flat_actions_map_into_the_nested_space():
    flat = nested.FlatActionSpace(ACTION)
    # free (1), kind (1), more: (2 indices, 3 bits), move (2).
    assert flat.shape == (9,)
    np.testing.assert_array_equal(flat.low, [-np.inf, 0, 0, 0, 0, 0, 0, -1, -1])
    np.testing.assert_array_equal(flat.high, [np.inf, 2, 1, 2, 1, 1, 1, 1, 1])
    action = flat.unflatten(np.array([7.5, 2, 1, 0, 1, 0, 1, -1.0, 3.0]))
    assert ACTION.contains(action)
    assert action["kind"] == 3 and action["free"] == 7.5
    np.testing.assert_array_equal(action["more"][0], [[1, 5]])
    np.testing.assert_array_equal(action["more"][1], [1, 0, 1])
    np.testing.assert_allclose(action["move"], [-2.0, 10.0])  # -1 -> low; 3 clipped to high.
    np.testing.assert_allclose(flat.unflatten(np.r_[0, 0, 0, 0, 0, 0, 0, 0, 0.5])["move"],
                               [0.0, 7.5])
    env = standard_wrappers(SpacesEnv(spaces.Box(-1, 1, (1,), np.float32), ACTION))
    assert env.action_space == flat
    env.reset(seed=0)
    env.step(np.array([7.5, 2, 1, 0, 1, 0, 1, -1.0, 3.0], np.float32))
    assert env.unwrapped.received[0]["kind"] == 3


def test_the_graph_maps_flat_actions_as_the_environment_wrapper_does():
    flat = nested.FlatActionSpace(ACTION)
    random = np.random.default_rng(0)
    actions = np.concatenate([
        random.normal(0, 3, (50, 1)), random.integers(0, 3, (50, 1)),
        random.integers(0, 2, (50, 1)), random.integers(0, 3, (50, 1)),
        random.integers(0, 2, (50, 3)), random.uniform(-1.5, 1.5, (50, 2))], 1)
    graph = spaces_lib.to_action_space(tf.constant(actions, tf.float32), ACTION)
    named = spaces_lib.named_actions(graph, ACTION)
    assert sorted(named) == ["action_free", "action_kind", "action_more_0", "action_more_1",
                             "action_move"]
    for row, action in enumerate(actions.astype(np.float32)):
        expected = flat.unflatten(action)
        assert ACTION.contains(expected)
        np.testing.assert_allclose(graph["move"][row], expected["move"], atol=1e-5)
        np.testing.assert_allclose(graph["free"][row], expected["free"], atol=1e-5)
        assert graph["kind"][row] == expected["kind"]
        np.testing.assert_array_equal(graph["more"][0][row], expected["more"][0])
        np.testing.assert_array_equal(graph["more"][1][row], expected["more"][1])


@pytest.mark.parametrize("action, message", [
    ([0, 3, 0, 0, 0, 0, 0, 0, 0], r"action\['kind'\]: \[3.0\] is not a valid flat action"),
    ([0, 0.5, 0, 0, 0, 0, 0, 0, 0], r"action\['kind'\]: \[0.5\]"),
    ([0, 0, 2, 0, 0, 0, 0, 0, 0], r"action\['more'\]\[0\]: \[2.0, 0.0\]"),
    ([0, 0, 0, 0, 0, 2, 0, 0, 0], r"action\['more'\]\[1\]"),
    ([0] * 8, r"flat action of shape \(8,\), expected \(9,\)"),
])
def test_invalid_flat_actions_name_the_leaf(action, message):
    with pytest.raises(ValueError, match=message):
        nested.FlatActionSpace(ACTION).unflatten(np.array(action, np.float32))


def _good():
    return {"position": np.zeros((2, 3)), "cue": 0,
            "more": (np.array([1, 2]), np.array([0, 1]), np.array([0.5]))}


def _changed(path, value):
    observation = _good()
    if path == ("more", 1):
        observation["more"] = (observation["more"][0], value, observation["more"][2])
    elif value is KeyError:
        del observation[path[0]]
    else:
        observation[path[0]] = value
    return observation


@pytest.mark.parametrize("observation, message", [
    (_changed(("position",), np.zeros(3)),
     r"observation\['position'\] of shape \(3,\), expected \(2, 3\)"),
    (_changed(("position",), np.full((2, 3), np.nan)), r"observation\['position'\] is not finite"),
    (_changed(("cue",), 2), r"observation\['cue'\] holds values outside Discrete\(3, start=-1\)"),
    (_changed(("cue",), KeyError), r"observation\['cue'\] is missing; expected keys"),
    (dict(_good(), extra=1), r"observation\['extra'\] is not in the space"),
    (_changed(("more",), (1, 2)), r"observation\['more'\] must be a tuple of 3 values"),
    (_changed(("more", 1), np.array([0, 2])), r"observation\['more'\]\[1\] holds values other"),
    ([1, 2], r"observation must be a mapping"),
])
def test_wrong_nested_observations_name_the_leaf(observation, message):
    nested.check_observation(OBSERVATION, _good())
    with pytest.raises(ValueError, match=message):
        nested.check_observation(OBSERVATION, observation)
    env = standard_wrappers(SpacesEnv(OBSERVATION, spaces.Discrete(2), [_good(), observation]))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=message):
        env.step(0)


def test_wrong_batches_name_the_leaf_and_the_environments():
    batch = _stack(OBSERVATION, [_good()] * 4)
    batch["cue"] = np.array([0, 2, 1, -2])
    with pytest.raises(ValueError, match=r"observation\['cue'\] .* for environments \[1, 3\]"):
        nested.check_batch(OBSERVATION, batch, 4)
    batch = _stack(OBSERVATION, [_good()] * 4)
    with pytest.raises(ValueError, match=r"observation\['cue'\] of shape \(4,\), expected \(5,\)"):
        nested.check_batch(OBSERVATION, batch, 5)


@pytest.mark.parametrize("observation_space, action_space, message", [
    (spaces.Dict({"a": spaces.Box(-1, 1, (1,)), "t": spaces.Text(4)}), spaces.Discrete(2),
     r"unsupported observation space .*: observation\['t'\] is Text"),
    (spaces.Box(-1, 1, (1,)), spaces.Tuple((spaces.Discrete(2), spaces.Tuple(()))),
     r"unsupported action space .*: action\[1\] is an empty Tuple"),
    (spaces.Box(-1, 1, (1,)), spaces.Text(3), r"unsupported action space Text"),
])
def test_unsupported_spaces_name_the_leaf(observation_space, action_space, message):
    with pytest.raises(ValueError, match=message):
        standard_wrappers(SpacesEnv(observation_space, action_space, [None]))


def test_flat_spaces_survive_pickling():
    for flat in (nested.FlatObservationSpace(OBSERVATION), nested.FlatActionSpace(ACTION)):
        copy = pickle.loads(pickle.dumps(flat))
        assert copy == flat and copy.space == flat.space
    assert nested.FlatActionSpace(spaces.MultiBinary(3)) != nested.FlatActionSpace(
        spaces.MultiDiscrete([2, 2, 2]))  # Same bounds, other nesting.


def test_dict_pendulum_flattens_to_pendulum():
    dict_pendulum = standard_wrappers(DictPendulum(), 200)
    pendulum = standard_wrappers(gymnasium.make("Pendulum-v1"), 200)
    np.testing.assert_array_equal(dict_pendulum.reset(seed=3)[0], pendulum.reset(seed=3)[0])
    for step in range(200):
        action = np.array([np.sin(step)], np.float32)
        ours, theirs = dict_pendulum.step(action), pendulum.step(action)
        np.testing.assert_array_equal(ours[0], theirs[0])
        assert ours[1:4] == theirs[1:4]
    assert ours[3], "truncated at 200 steps"


def _bad_reach_and_choose():
    env = ReachAndChoose()
    env.observation_space = spaces.Dict({"cue": spaces.Discrete(3),
                                         "target": spaces.Box(-1, 1, (3,), np.float32)})
    return standard_wrappers(env, 20)


def test_nested_spaces_in_worker_processes():
    constructor = lambda: standard_wrappers(ReachAndChoose(), 20)  # noqa: E731
    with ParallelBatchEnv(constructor, 3, num_workers=2) as batch_env:
        assert isinstance(batch_env.observation_space, nested.FlatObservationSpace)
        assert batch_env.action_space == nested.FlatActionSpace(ReachAndChoose().action_space)
        observ, _ = batch_env.reset(seed=0)
        assert observ.shape == (3, 5) and observ[:, :3].sum(1).tolist() == [1, 1, 1]
        # The right kind (cue + 1, index cue) and the perfect move earn 1.
        cue = observ[:, :3].argmax(1)
        actions = np.concatenate([cue[:, None], observ[:, 3:]], 1).astype(np.float32)
        _, reward, *_ = batch_env.step(actions)
        np.testing.assert_allclose(reward, 1.0)
    with ParallelBatchEnv(_bad_reach_and_choose, 2, num_workers=1) as batch_env:
        with pytest.raises(WorkerError, match=r"observation\['target'\] of shape \(2,\), "
                                              r"expected \(3,\)"):
            batch_env.reset(seed=0)
