"""`--eager` runs every function eagerly and computes what the traced run computes."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from batchrl.scripts import train

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
TINY = ["--set", "steps=40", "--set", "eval_every=20", "--set", "log_every=20",
        "--set", "num_agents=2", "--set", "update_every=2", "--set", "eval_episodes=2",
        "--set", "max_length=10", "--set", "env_backend=local"]


def _summaries(directory):
    """Every summary under `directory`: tag -> list of (step, value as a NumPy array)."""
    accumulator = event_accumulator.EventAccumulator(
        str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return {tag: [(event.step, tensor_util.make_ndarray(event.tensor_proto))
                  for event in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()["tensors"]}


@pytest.mark.parametrize("config, algorithm", [
    ("pendulum", "ppo"), ("pendulum_trpo", "trpo"), ("cartpole_a2c", "a2c"),
    (str(EXAMPLES / "reinforce.yaml"), "reinforce:REINFORCE")])
def test_eager_and_traced_runs_write_the_same_losses(tmp_path, monkeypatch, capsys, config,
                                                     algorithm):
    """Two train phases of an update each; the losses, KLs, scores and histograms of both
    runs agree (within float32 rounding: the traced graph is optimized)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))  # reinforce.py, docs/algorithms.md's example.
    arguments = [f"--config={config}", "--set", f"algorithm={algorithm}", *TINY]
    if algorithm == "ppo":
        arguments += ["--set", "update_epochs=1"]
    if algorithm == "trpo":  # Fewer of the iterations that an eager update runs one by one.
        arguments += ["--set", "optimizer={type: natural_gradient, max_kl: 0.01, "
                               "cg_iterations: 3, damping: 0.1, line_search: "
                               "{max_iterations: 3, accept_ratio: 0.1}}",
                      "--set", "value_optimizer={type: multi_step, steps: 3, "
                               "optimizer: {type: adam}}"]
    assert train.main([*arguments, f"--logdir={tmp_path / 'traced'}"]) == 0
    assert "tf.function traces: 1" in capsys.readouterr().out
    assert train.main([*arguments, "--eager", f"--logdir={tmp_path / 'eager'}"]) == 0
    assert "Ran eagerly" in capsys.readouterr().out
    assert not tf.config.functions_run_eagerly(), "the process's setting is restored"
    traced = _summaries(tmp_path / "traced" / "train")
    eager = _summaries(tmp_path / "eager" / "train")
    name = algorithm.split(":")[-1].lower()
    losses = [tag for tag in traced if "loss" in tag]
    assert losses and all(tag.startswith(name + "/") for tag in losses), losses
    assert traced.keys() == eager.keys()
    for tag in [tag for tag in traced if not tag.startswith("time/")]:  # Wall-clock times.
        assert [step for step, _ in traced[tag]] == [step for step, _ in eager[tag]], tag
        assert len(traced[tag]) >= 2 or tag.startswith(("mean_", "normalize_")), tag
        for (_, first), (_, second) in zip(traced[tag], eager[tag], strict=True):
            np.testing.assert_allclose(first, second, rtol=1e-3, atol=1e-5, err_msg=tag)
