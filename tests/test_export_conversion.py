"""The exported SavedModel served without batchrl, and converted to TensorFlow Lite and to
ONNX, acts as `batchrl.Agent`.

The SavedModel is served in a process that never imports batchrl. The conversions are the
standard ones docs/agent.md gives: `tf.lite.TFLiteConverter.from_saved_model(dir,
signature_keys=[KEY])` run by TFLite's interpreter, and `python -m tf2onnx.convert
--saved-model dir --signature_def KEY` run by ONNX Runtime. Their mean actions must equal
`act(observation, deterministic=True)` within 1e-5 (the recurrent policy's over several steps
that carry the state), and their sampled actions must follow the policy's distribution.
"""

import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl.agent import Agent

SMALL = {"policy_layers": [16], "value_layers": [16], "max_length": 10}
BOX = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACTION = spaces.Box(np.array([0.0, -2.0], np.float32), np.array([1.0, 2.0], np.float32))
NUM_ENVS = 16
STEPS = 4  # Deterministic steps compared; the recurrent state is carried through them.
DRAWS = 4000  # Samples of one observation's action.

POLICIES = {
    "gaussian": ("feed_forward_gaussian", BOX, ACTION),
    "categorical": ("feed_forward_categorical",
                    gym.make("CartPole-v1").observation_space, spaces.Discrete(2)),
    "recurrent": ("recurrent_gaussian", BOX, ACTION),
}
# One process for all the models (argv: their directories), which never imports batchrl:
# it serves each SavedModel's `serving_default` over the `STEPS` observations (carrying a
# recurrent policy's state) and `sample` once, then runs tf2onnx's command line once per
# signature; the error of a signature that does not convert goes to stderr. An ONNX graph's
# input and output cannot share a name, so a recurrent policy's output `state` is renamed.
_SERVE_AND_CONVERT = """
import sys
import traceback
import numpy as np
import tensorflow as tf
for directory in sys.argv[1:]:
    model = tf.saved_model.load(f"{directory}/model")
    serve, sample = model.signatures["serving_default"], model.signatures["sample"]
    observations = np.load(f"{directory}/observations.npy")
    state_spec = serve.structured_input_signature[1].get("state")
    state = None if state_spec is None else tf.zeros(
        [observations.shape[1], state_spec.shape[1]])
    actions = []
    for observation in observations:
        inputs = {"observation": tf.constant(observation)}
        outputs = serve(**inputs, **({} if state is None else {"state": state}))
        actions.append(outputs["action"].numpy())
        state = outputs.get("state")
    state = {} if state_spec is None else {"state": tf.zeros_like(state)}
    sampled = sample(observation=tf.constant(observations[0]), **state)["action"].numpy()
    np.savez(f"{directory}/served.npz", actions=np.stack(actions), sampled=sampled)
assert "batchrl" not in sys.modules
import tf2onnx.convert
for directory in sys.argv[1:]:
    recurrent = "state" in tf.saved_model.load(f"{directory}/model").signatures[
        "serving_default"].structured_input_signature[1]
    for key in ("serving_default", "sample"):
        sys.argv = ["tf2onnx.convert", "--saved-model", f"{directory}/model",
                    "--signature_def", key, "--output", f"{directory}/onnx/{key}.onnx"]
        sys.argv += ["--rename-outputs", "action,next_state"] if recurrent else []
        try:
            tf2onnx.convert.main()
        except Exception:
            print(f"{directory} {key}: " + traceback.format_exc(), file=sys.stderr)
"""


def _observations(space, random, count):
    """Observations far from the normalizer's initial mean 0 and scale 1."""
    return random.normal(2.0, 3.0, (count, *space.shape)).astype(np.float32)


def _export(name, directory):
    """An agent of the policy `name` with parameters as training would leave them (its
    observation normalizer fed 160 observations, its policy's weights moved at random), its
    mean actions for `STEPS` steps of fresh observations, its policy's distribution
    parameters for the first observation (the reference of sampled actions), and its
    SavedModel in `directory / "model"`. (Training itself would trace the update, seconds
    that add nothing here.)"""
    network, observation_space, action_space = POLICIES[name]
    agent = Agent.create(dict(SMALL), observation_space, action_space, num_envs=NUM_ENVS,
                         network=network)
    random = np.random.default_rng(0)
    algo = agent._algo
    algo.checkpoint_state["observ_filter"].update(
        _observations(observation_space, random, 10 * NUM_ENVS))
    for variable in algo.networks.policy.trainable_variables:
        variable.assign_add(random.normal(0.0, 0.05, variable.shape).astype(np.float32))
    observations = [_observations(observation_space, random, NUM_ENVS) for _ in range(STEPS)]
    actions = [agent.act(observation, deterministic=True) for observation in observations]
    normalized = algo.checkpoint_state["observ_filter"].transform(observations[0][:1])
    params, _ = algo.networks.policy(normalized[:, None], tf.zeros([1, algo.state_size]))
    agent.export(directory / "model")
    np.save(directory / "observations.npy", np.stack(observations))
    return {"name": name, "directory": directory / "model", "root": directory,
            "observations": observations, "actions": actions, "state_size": algo.state_size,
            "action_space": action_space,
            "params": {key: value.numpy()[0, 0] for key, value in params.items()}}


@pytest.fixture(scope="module")
def exported_models(tmp_path_factory):
    """`_export` of each policy of `POLICIES`, by name."""
    return {name: _export(name, tmp_path_factory.mktemp(name)) for name in sorted(POLICIES)}


@pytest.fixture(scope="module")
def served_and_converted(exported_models):
    """Runs `_SERVE_AND_CONVERT` on all the models; its messages."""
    result = subprocess.run(
        [sys.executable, "-c", _SERVE_AND_CONVERT,
         *(str(exported["root"]) for exported in exported_models.values())],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def _tflite(exported, key):
    """The signature `key` of the TFLite model converted from the SavedModel, as a function
    of a dict of inputs to a dict of outputs."""
    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(exported["directory"]), signature_keys=[key])
    model = converter.convert()
    with warnings.catch_warnings():  # tf.lite.Interpreter's notice of LiteRT.
        warnings.simplefilter("ignore", UserWarning)
        interpreter = tf.lite.Interpreter(model_content=model)
    serve = interpreter.get_signature_runner(key)
    expected_inputs = {"observation"} | ({"state"} if exported["state_size"] else set())
    assert set(serve.get_input_details()) == expected_inputs
    return lambda inputs: serve(**inputs)


def _onnx(exported, messages, key):
    """The ONNX model of signature `key` in ONNX Runtime, as `_tflite`'s function (its
    output `next_state` named `state` again); `messages`: those of tf2onnx."""
    path = exported["root"] / "onnx" / f"{key}.onnx"
    assert path.exists(), messages[-3000:]
    session = onnxruntime.InferenceSession(
        str(path), providers=["CPUExecutionProvider"])
    recurrent = bool(exported["state_size"])
    assert {node.name for node in session.get_inputs()} == (
        {"observation", "state"} if recurrent else {"observation"})
    names = [node.name for node in session.get_outputs()]
    assert names == (["action", "next_state"] if recurrent else ["action"])

    def run(inputs):
        outputs = dict(zip(names, session.run(names, inputs), strict=True))
        if recurrent:
            outputs["state"] = outputs.pop("next_state")
        return outputs
    return run


def _savedmodel(exported, key):
    serve = tf.saved_model.load(str(exported["directory"])).signatures[key]
    return lambda inputs: {name: value.numpy() for name, value in serve(**{
        name: tf.constant(value) for name, value in inputs.items()}).items()}


def _model(runtime, exported, request, key):
    if runtime == "tflite":
        return _tflite(exported, key)
    if runtime == "onnx":
        return _onnx(exported, request.getfixturevalue("served_and_converted"), key)
    return _savedmodel(exported, key)


def _inputs(exported, observation, state=None):
    inputs = {"observation": observation}
    if exported["state_size"]:
        inputs["state"] = (np.zeros((len(observation), exported["state_size"]), np.float32)
                           if state is None else state)
    return inputs


@pytest.mark.parametrize("runtime", ["savedmodel", "tflite", "onnx"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_converted_mean_actions_equal_the_agents(exported_models, name, runtime, request):
    """The SavedModel's (`runtime` savedmodel) served in a process that never imports
    batchrl; the converted ones here."""
    exported = exported_models[name]
    if runtime == "savedmodel":
        request.getfixturevalue("served_and_converted")
        with np.load(exported["root"] / "served.npz") as served:
            actions, sampled = served["actions"], served["sampled"]
        assert sampled.shape == actions[0].shape and sampled.dtype == actions.dtype
        if name != "categorical":
            assert not np.allclose(sampled, actions[0]), "sample draws from the policy"
        actions = iter(actions)

        def serve(inputs):
            return {"action": next(actions)}
    else:
        serve = _model(runtime, exported, request, "serving_default")
    state = None
    for step, observation in enumerate(exported["observations"]):
        outputs = serve(_inputs(exported, observation, state))
        action, expected = outputs["action"], exported["actions"][step]
        state = outputs.get("state")
        assert np.all(np.isfinite(action)), f"step {step}: {action}"
        assert action.shape == expected.shape and action.dtype == expected.dtype, step
        np.testing.assert_allclose(action, expected, atol=1e-5, err_msg=f"step {step}")


@pytest.mark.parametrize("runtime", ["savedmodel", "tflite", "onnx"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_sampled_actions_follow_the_policy(exported_models, name, runtime, request):
    """`DRAWS` sampled actions of one observation (the recurrent policy's from the zero
    state) against the policy's distribution: a categorical's frequencies against
    softmax(logits) within 0.03 (4 standard errors); a Gaussian's quartiles, mapped back
    from the action bounds to [-1, 1], against mean + z std (z = 0, +-0.674) within 0.1 std
    (4.6 standard errors). A second call draws anew."""
    exported = exported_models[name]
    sample = _model(runtime, exported, request, "sample")
    observation = np.repeat(exported["observations"][0][:1], DRAWS, 0)
    first = sample(_inputs(exported, observation))["action"]
    second = sample(_inputs(exported, observation))["action"]
    assert first.shape == second.shape == (DRAWS,) + exported["action_space"].shape
    assert not np.array_equal(first, second)
    params = exported["params"]
    if "logits" in params:
        logits = params["logits"].astype(np.float64)
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        frequencies = np.bincount(first, minlength=len(logits)) / DRAWS
        np.testing.assert_allclose(frequencies, probabilities, atol=0.03)
        return
    low, high = exported["action_space"].low, exported["action_space"].high
    action = 2 * (first - low) / (high - low) - 1
    mean = params["mean"]
    std = np.broadcast_to(np.exp(params["logstd"]), mean.shape)
    for z, quantile in [(-0.6745, 0.25), (0.0, 0.5), (0.6745, 0.75)]:
        expected = mean + z * std
        assert np.all(np.abs(expected) < 0.95), "the quartiles are inside the bounds"
        np.testing.assert_allclose(np.quantile(action, quantile, axis=0), expected,
                                   atol=0.1 * std.min(), err_msg=f"quantile {quantile}")
