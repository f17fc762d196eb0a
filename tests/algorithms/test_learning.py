"""Each shipped algorithm family learns: a short run of `train` (seed 0, in this process) on
an in-graph task compiled with XLA must end far above a random policy's return.

Random policies score about -1,200 on Pendulum and 22 on CartPole; each threshold is far
above that and well below what the run reaches (docs/results.md has the full runs).
Longer learning runs are benchmarks, not tests: the recurrent PPO policy
(`batchrl-benchmark --configs pendulum_recurrent`), TRPO (`--configs pendulum_trpo`), A2C
(`--configs cartpole_a2c`; it had a run here: in-graph CartPole with `jit_step`, seed 0,
190 at 30k steps), IMPALA (`--configs cartpole_impala`) and docs/algorithms.md's REINFORCE
(`python examples/reinforce.py`; it had a run here: 390 at 15k steps). Their updates are
checked against NumPy (tests/algorithms/test_impala.py: IMPALA's targets and loss;
tests/algorithms/test_ppo_data_flow.py: chunks replayed from the
stored states; tests/algorithms/test_trpo_a2c.py: TRPO's surrogate, A2C's actor loss, the
value loss; tests/optimizers/test_optimizers.py: the natural gradient step within its KL
bound); PPO's run here trains their shared code (`OnPolicyAlgorithm`); A2C trains inside
`simulate` in tests/algorithms/test_builder.py and REINFORCE through `train` in
tests/examples/test_reinforce_example.py.
"""

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, environments
from batchrl.scripts import train
from batchrl.scripts.events import read_scalars
from batchrl.scripts.visualize import find_run, restore

NATIVE_PENDULUM = ["env=batchrl.native_tasks:Pendulum", "jit_step=true", "steps_per_call=200"]


def _final_eval(tmp_path, config, sets):
    """Trains `config` with the `--set` items `sets` into `tmp_path`; returns the run
    directory and its last eval return."""
    logdir = tmp_path / "run"
    argv = [f"--config={config}", f"--logdir={logdir}", "--no-progress", "--set", "seed=0"]
    assert train.main(argv + [item for key in sets for item in ("--set", key)]) == 0
    scores = read_scalars(logdir / "eval", "mean_score")
    assert scores, "no eval was written"
    return logdir, scores[-1].value


def test_ppo_learns_pendulum(tmp_path):
    # -186 / -251 at 12k steps (seeds 0 / 1), -172 at 16k (seed 0). The observation and
    # reward normalizers' running statistics of the run, restored from its checkpoint,
    # change both (without normalization they leave them as they are: tests/algorithms/test_ppo.py).
    logdir, score = _final_eval(tmp_path, "pendulum_native", ["steps=12000"])
    assert score >= -400
    config, checkpoint = find_run(logdir)
    built = build.build(config, environments.create_batch(config))
    restore(built, checkpoint)
    observ = tf.constant(np.random.default_rng(0).normal(size=(5, 3)), tf.float32)
    reward = tf.constant([-1.0, -4.0, -9.0])
    observ_filtered = built.algo._observ_filter.transform(observ).numpy()
    reward_filtered = built.algo._reward_filter.transform(reward).numpy()
    assert np.abs(observ_filtered - observ.numpy()).max() > 0.1
    assert np.abs(reward_filtered - reward.numpy()).max() > 0.1


def test_pqn_learns_cartpole(tmp_path):
    # The in-graph CartPole, steps and updates in one XLA program: 500 at 40,960 steps
    # (seed 0); a random policy scores 22.
    _, score = _final_eval(tmp_path, "cartpole_pqn", [
        "env=batchrl.native_tasks:CartPole", "jit_step=true", "steps_per_call=64",
        "steps=40960", "eval_every=40960"])
    assert score >= 200


@pytest.mark.parametrize("blank, reaches", [(None, True), ("image", False)])
def test_the_multimodal_task_is_learned_only_with_both_entries(tmp_path, blank, reaches):
    # One layer list per observation entry (a convolution on the image, a dense layer on
    # the cue): 20 of 20 at 2k steps, two updates (seed 0); with the image blanked,
    # chance (about 10; 9.9-10.9 at 30k steps, docs/results.md).
    sets = ["steps=2000"] + ([f"env_kwargs={{blank: {blank}}}"] if blank else [])
    _, score = _final_eval(tmp_path, "image_and_cue", sets)
    assert (score >= 18) == reaches, score
