"""Off-policy runs of the train command (its `main`, in this process): stopped with Ctrl-C
and resumed, a run with `save_replay: true` continues with the replay memory it had, kept
once in RUN/replay/ beside the latest checkpoint and in no checkpoint; without it, no
memory is saved."""

import signal

import numpy as np
import tensorflow as tf

from batchrl.drivers.loop import Loop
from batchrl.scripts import train

# Tiny networks, one eval episode, and the update left to TensorFlow (pendulum_sac compiles
# it with XLA, which would take longer than these short runs train).
SMALL = ["--set", "policy_layers=[16]", "--set", "value_layers=[16]", "--set", "num_agents=2",
         "--set", "eval_every=400", "--set", "eval_episodes=1", "--set", "learning_starts=100",
         "--set", "replay_capacity=100000", "--set", "batch_size=16", "--set",
         "jit_update=false", "--no-progress"]


def _replay(checkpoint):
    """The replay memory's size and stored rows in a checkpoint (None without one): the
    replay that `save_replay` keeps beside checkpoint `RUN/ckpt-S` is `RUN/replay/ckpt-S`."""
    reader = tf.train.load_checkpoint(str(checkpoint))
    names = reader.get_variable_to_shape_map()
    size = [name for name in names if name.startswith("replay/") and "_size" in name]
    if not size:
        return None
    rows = int(reader.get_tensor(size[0]))
    storage = {name.split("/")[2]: reader.get_tensor(name)[:rows] for name in names
               if name.startswith("replay/storage/")}
    return rows, storage


def _variables(checkpoint):
    """`{name: shape}` of the variables in the checkpoint at prefix `checkpoint`."""
    return dict(tf.train.list_variables(str(checkpoint)))


def test_sigint_then_resume_continues_with_the_same_replay_memory_kept_once(
        tmp_path, capsys, monkeypatch):
    """Ctrl-C, raised in this process at step 600, in the second train phase (the signal
    handling of the command in a process of its own: tests/scripts/test_train.py): the run
    stops there and saves its replay memory with the checkpoint of step 600, which no eval
    (every 400 steps) would have written. Two checkpoints kept, one replay: that of the
    latest, which the resumed run restores before it trains on (and the next save
    replaces)."""
    logdir = tmp_path / "run"
    args = ["--config=pendulum_sac", f"--logdir={logdir}", "--set", "steps=1000000",
            "--set", "save_replay=true", *SMALL]
    raised = []

    def ctrl_c_at_step_600(loop, check=Loop._check_stop):
        if int(loop._step.numpy()) >= 600 and not raised:
            raised.append(int(loop._step.numpy()))
            signal.raise_signal(signal.SIGINT)
        return check(loop)

    with monkeypatch.context() as patch:
        patch.setattr(Loop, "_check_stop", ctrl_c_at_step_600)
        assert train.main(args) == 128 + signal.SIGINT
    stderr = capsys.readouterr().err
    stopped = int(stderr.split("Stopped at step ")[1].split(";")[0].replace(",", ""))
    assert stopped == raised[0] == 600, stderr
    checkpoints = sorted(path.name for path in logdir.glob("ckpt-*.index"))
    assert checkpoints == [f"ckpt-{step}.index" for step in (400, 600)]
    for name in checkpoints:
        names = _variables(logdir / name.removesuffix(".index"))
        assert "critic/_output/bias/.ATTRIBUTES/VARIABLE_VALUE" in names
        assert not [key for key in names if key.startswith("replay/")], name
    assert sorted(path.name for path in (logdir / "replay").iterdir()) == [
        "ckpt-600.data-00000-of-00001", "ckpt-600.index"]
    assert _variables(logdir / "replay" / "ckpt-600")[
        "replay/storage/observ/.ATTRIBUTES/VARIABLE_VALUE"] == [100001, 3]
    rows, stored = _replay(logdir / "replay" / f"ckpt-{stopped}")
    assert rows == stopped  # Every training step stored one transition, eval steps none.

    more = [arg.replace("steps=1000000", f"steps={stopped + 400}") for arg in args]
    assert train.main(more) == 0
    assert (f"Replay memory: 600 transitions from {logdir / 'replay' / 'ckpt-600'}."
            in capsys.readouterr().out)
    assert sorted(path.name for path in (logdir / "replay").iterdir()) == [
        "ckpt-1000.data-00000-of-00001", "ckpt-1000.index"]
    final_rows, final = _replay(logdir / "replay" / f"ckpt-{stopped + 400}")
    assert final_rows == stopped + 400  # Not 400: the resumed run went on from its 600.
    for key, value in stored.items():
        np.testing.assert_array_equal(final[key][:rows], value, err_msg=key)


def test_sac_on_a_dict_observation_trains_and_exports_without_saving_its_memory(tmp_path):
    """Nested observations arrive flattened; the exported SAC actor takes the named leaves
    and serves the deterministic action of the policy restored from the checkpoint, mapped
    from [-1, 1] onto Pendulum's torque bounds; its `sample` draws around it. The run has no
    `save_replay`: its checkpoint holds the networks and no replay memory, and there is no
    RUN/replay/."""
    logdir = tmp_path / "run"
    assert train.main(["--config=pendulum_sac", f"--logdir={logdir}", "--set", "steps=400",
                       "--set", "env=batchrl.environments.nested_tasks:DictPendulum",
                       "--set", "max_length=200", *SMALL]) == 0
    assert _replay(logdir / "ckpt-400") is None
    assert not (logdir / "replay").exists()
    names = tf.train.load_checkpoint(str(logdir / "ckpt-400")).get_variable_to_shape_map()
    assert any(name.startswith("target_critic/") for name in names)
    from batchrl.scripts import export
    assert export.main([f"--logdir={logdir}", f"--outdir={tmp_path / 'model'}"]) == 0
    model = tf.saved_model.load(str(tmp_path / "model"))
    inputs = model.signatures["serving_default"].structured_input_signature[1]
    assert sorted(inputs) == ["observation_angle", "observation_velocity"]
    rng = np.random.default_rng(0)
    angle = rng.uniform(-np.pi, np.pi, 50)
    feed = {"observation_angle": np.stack([np.cos(angle), np.sin(angle)], 1),
            "observation_velocity": rng.uniform(-8, 8, (50, 1))}
    feed = {name: tf.constant(value, tf.float32) for name, value in feed.items()}
    action = model.signatures["serving_default"](**feed)["action"].numpy()
    sampled = model.signatures["sample"](**feed)["action"].numpy()
    # Flattened as Gymnasium flattens the Dict (keys sorted): cos, sin, velocity.
    flat = np.concatenate([feed["observation_angle"], feed["observation_velocity"]], 1)
    mean = _restored_mean_actions(logdir, flat)
    assert action.shape == (50, 1) and np.ptp(mean) > 0.05  # Not one action for all.
    np.testing.assert_allclose(action, -2.0 + (np.clip(mean, -1, 1) + 1) / 2 * 4.0,
                               atol=1e-5)
    assert np.abs(sampled).max() <= 2.0 and not np.allclose(sampled, action)


def _restored_mean_actions(logdir, observation):
    """The deterministic actions in [-1, 1] of the run's policy restored from its latest
    checkpoint, as `visualize` restores it, for flat observations `[n, size]`."""
    from batchrl import build, environments
    from batchrl.environments.local import BatchEnv
    from batchrl.scripts.visualize import find_run, restore

    config, checkpoint = find_run(logdir)
    env = environments.create(config.env, environments.episode_limit(config))
    batch_env = BatchEnv([env], blocking=True)
    try:
        built = build.build(config, batch_env, process_eager=False)
        restore(built, checkpoint)
        state = tf.zeros([len(observation), 0])
        return built.algo.policy_action(tf.constant(observation), state)[0].numpy()
    finally:
        batch_env.close()
