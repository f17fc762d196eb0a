"""Each shipped algorithm family learns: a short run of `train` (seed 0, in this process) on
an in-graph task compiled with XLA must end far above a random policy's return.

Random policies score about -1,200 on Pendulum and 22 on CartPole; each threshold is far
above that and well below what the run reaches (docs/results.md has the full runs).
Longer learning runs belong to `batchrl-benchmark`, not here.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, environments
from batchrl.scripts import train
from batchrl.scripts.events import read_scalars
from batchrl.scripts.visualize import find_run, restore

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
NATIVE_PENDULUM = ["env=batchrl.envs:Pendulum", "jit_step=true", "steps_per_call=200"]
NATIVE_CARTPOLE = ["env=batchrl.envs:CartPole", "jit_step=true", "steps_per_call=100"]


def _final_eval(tmp_path, config, sets):
    """Trains `config` with the `--set` items `sets` into `tmp_path`; returns the run
    directory and its last eval return."""
    logdir = tmp_path / "run"
    argv = [f"--config={config}", f"--logdir={logdir}", "--no-progress", "--set", "seed=0"]
    assert train.main(argv + [item for key in sets for item in ("--set", key)]) == 0
    scores = read_scalars(logdir / "eval", "mean_score")
    assert scores, "no eval was written"
    return logdir, scores[-1].value


def test_recurrent_ppo_learns_pendulum(tmp_path):
    # A GRU policy trained on chunks replayed from stored states: about -180 at 16k steps.
    _, score = _final_eval(tmp_path, "pendulum_native",
                           ["network=recurrent_gaussian", "steps=16000"])
    assert score >= -400


def test_trpo_learns_pendulum(tmp_path):
    # About -230 at 30k steps (-720 at 20k).
    _, score = _final_eval(tmp_path, "pendulum_trpo", NATIVE_PENDULUM + [
        "steps=30000", "eval_every=10000"])
    assert score >= -600


def test_a2c_learns_cartpole(tmp_path):
    # 190 at 30k steps (500, the episode limit, on other seeds).
    _, score = _final_eval(tmp_path, "cartpole_a2c", NATIVE_CARTPOLE + [
        "steps=30000", "eval_every=10000"])
    assert score >= 100


def test_reinforce_of_build_algorithm_learns_cartpole(tmp_path, monkeypatch):
    # docs/algorithms.md's example algorithm: about 400 at 20k steps.
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "reinforce", raising=False)
    _, score = _final_eval(tmp_path, EXAMPLES / "reinforce.yaml", NATIVE_CARTPOLE + [
        "steps=20000", "eval_every=10000"])
    assert score >= 150


@pytest.mark.parametrize("normalize", [True, False])
def test_ppo_learns_pendulum(tmp_path, normalize):
    # About -170 at 16k steps; without normalization, where the policy sees raw
    # observations and the update raw rewards, about -185.
    flag = str(normalize).lower()
    logdir, score = _final_eval(tmp_path, "pendulum_native", [
        "steps=16000", f"normalize_observ={flag}", f"normalize_reward={flag}"])
    assert score >= -400
    config, checkpoint = find_run(logdir)
    built = build.build(config, environments.create_batch(config))
    restore(built, checkpoint)
    observ = tf.constant(np.random.default_rng(0).normal(size=(5, 3)), tf.float32)
    reward = tf.constant([-1.0, -4.0, -9.0])
    observ_filtered = built.algo._observ_filter.transform(observ).numpy()
    reward_filtered = built.algo._reward_filter.transform(reward).numpy()
    if normalize:  # The running statistics of the run change both.
        assert np.abs(observ_filtered - observ.numpy()).max() > 0.1
        assert np.abs(reward_filtered - reward.numpy()).max() > 0.1
    else:
        np.testing.assert_array_equal(observ_filtered, observ.numpy())
        np.testing.assert_array_equal(reward_filtered, reward.numpy())


@pytest.mark.parametrize("blank, reaches", [(None, True), ("image", False)])
def test_the_multimodal_task_is_learned_only_with_both_entries(tmp_path, blank, reaches):
    # One layer list per observation entry (a convolution on the image, a dense layer on
    # the cue): 20 of 20 at 10k steps; with the image blanked, chance (about 10).
    sets = ["steps=10000"] + ([f"env_kwargs={{blank: {blank}}}"] if blank else [])
    _, score = _final_eval(tmp_path, "image_and_cue", sets)
    assert (score >= 18) == reaches, score
