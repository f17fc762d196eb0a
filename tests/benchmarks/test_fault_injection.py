"""A short fault-injection run in CI (`--quick`: runs of 1,600 steps): the trainer
SIGKILLed inside a checkpoint write and resumed (`python -m benchmarks.faults` does 20
random trials of 8,000 steps, of every fault, a SIGKILL between checkpoints among them;
SIGTERM and Ctrl-C, then resume: tests/scripts/test_train.py and test_off_policy_train.py;
its NaN action on the EnvPool backend, in the trainer's process: test_train.py).
A worker killed mid-run and an environment whose `reset` raises: at the level of the batch
environment (tests/environments/test_parallel_batch_env.py)."""

import numpy as np

from benchmarks.faults import evidence
from benchmarks.faults import injection as fault_injection

TOTALS = ("hangs: 0", "leftover processes: 0", "unreadable checkpoints: 0",
          "lost more than one checkpoint interval: 0", "unexpected outcome: 0")


def test_faults_leave_nothing_behind(tmp_path):
    """A run killed inside its checkpoint write, then resumed. (A worker killed with
    SIGKILL, reported and its batch's workers gone: `test_killed_worker_is_reported_quickly`
    of tests/environments/test_parallel_batch_env.py, as a worker whose reset raises; the
    error line of `train` when an environment fails mid-run: tests/scripts/test_train.py.)"""
    output = tmp_path / "faults.md"
    code = fault_injection.main(["--quick", "--trials", "1", "--faults", "sigkill-save",
                                 "--output", str(output)])
    text = output.read_text()
    assert code == 0, text
    for line in TOTALS:
        assert line in text
    killed, = (line for line in text.splitlines() if line.startswith("| 0 | sigkill-save |"))
    # The short run was still going when killed, and resumed from its checkpoint.
    assert "exit -9" in killed and "resumed run exit 0" in killed, text


def test_bad_actions_spoil_env_1_only():
    from gymnasium import spaces

    from benchmarks.faults import actions

    box = actions.spoil(np.full((3, 1), 0.5), spaces.Box(-1.0, 1.0, (1,)), "nan")
    assert box.dtype == np.float32 and np.isnan(box[1, 0])
    np.testing.assert_array_equal(box[[0, 2]], [[0.5], [0.5]])
    # One past the last action of the space: Discrete(2) takes 0 and 1.
    assert actions.spoil(np.array([0, 1, 1]), spaces.Discrete(2), "bad").tolist() == [0, 2, 1]
    assert actions.spoil([1, 1], spaces.Discrete(3, start=1), "bad").tolist() == [1, 4]


# The options of every run before `--config` (`python -m benchmarks.faults` with PPO).
PPO_SETTINGS = ["--set", "steps=8000", "--set", "eval_every=1000", "--set", "num_agents=4",
                "--set", "eval_episodes=2", "--set", "worker_timeout=5", "--set",
                "max_length=200", "--set", "update_every=4", "--set", "update_epochs=2",
                "--no-progress"]


def _set_pairs(command):
    """The `KEY=VALUE` of each `--set` of `command`."""
    return [value for option, value in zip(command, command[1:], strict=False)
            if option == "--set"]


def _config_name(command):
    """The `NAME` of `--config=NAME` in `command` (exactly one)."""
    name, = (arg.split("=", 1)[1] for arg in command if arg.startswith("--config="))
    return name


def test_on_policy_settings_are_unchanged():
    assert sorted(fault_injection.settings("pendulum")) == sorted(PPO_SETTINGS)
    assert fault_injection.action_config("nan-action", "pendulum") == "pendulum"
    assert fault_injection.action_config("bad-action", "pendulum") == "cartpole"


def test_sac_settings_hold_no_on_policy_key_and_save_the_replay():
    from batchrl.algorithms.ppo import PPO
    from batchrl.algorithms.sac import SAC

    pairs = _set_pairs(fault_injection.settings("pendulum_sac"))
    keys = {pair.split("=", 1)[0] for pair in pairs}
    assert not keys & (PPO.config_keys - SAC.config_keys), keys
    assert not keys & {"update_every", "update_epochs"}
    assert "save_replay=true" in pairs
    assert "learning_starts=200" in pairs


def test_sac_commands_load_and_build(tmp_path):
    from batchrl import build, configs
    from batchrl.algorithms.dqn import DQN
    from batchrl.algorithms.sac import SAC

    commands = [
        (fault_injection._command(tmp_path, ["--set", f"env={fault_injection.ENV_NAME}"],
                                  "pendulum_sac"), SAC),
        (fault_injection._command(tmp_path, ["--set", f"env={fault_injection.ENVPOOL_NAME}"],
                                  "pendulum_sac", backend="envpool",
                                  module="benchmarks.faults.train"), SAC)]
    for kind, algorithm, env in (("nan-action", SAC, "envpool:Pendulum-v1"),
                                 ("bad-action", DQN, "envpool:CartPole-v1")):
        config = fault_injection.action_config(kind, "pendulum_sac")
        commands.append((fault_injection._command(
            tmp_path, ["--set", f"env={env}"], config, backend="envpool",
            module="benchmarks.faults.actions"), algorithm))
    for command, algorithm in commands:
        config = configs.load(_config_name(command), _set_pairs(command))
        assert config.save_replay and config.replay_capacity == fault_injection.REPLAY_CAPACITY
        assert build.algorithm_class(config) is algorithm, command
    # The bad-action run of the on-policy default: PPO on EnvPool's CartPole.
    command = fault_injection._command(
        tmp_path, ["--set", "env=envpool:CartPole-v1"],
        fault_injection.action_config("bad-action", "pendulum"), backend="envpool",
        module="benchmarks.faults.actions", schedule=fault_injection.QUICK)
    config = configs.load(_config_name(command), _set_pairs(command))
    assert (config.algorithm, config.env, config.env_backend, config.steps) == (
        "ppo", "envpool:CartPole-v1", "envpool", fault_injection.QUICK.steps)


def test_a_discrete_only_config_is_refused(capsys):
    try:
        fault_injection.main(["--config", "cartpole_dqn", "--trials", "0"])
    except SystemExit as exit_:
        assert exit_.code == 2
    else:
        raise AssertionError("--config cartpole_dqn was accepted")
    assert "acts only in Discrete action spaces" in capsys.readouterr().err


def test_replay_kept_needs_a_transition_per_step(tmp_path):
    import tensorflow as tf

    from batchrl.memories.replay import ReplayMemory

    def saved(name, stored, step=8000, replay=True):
        """A run directory as the Loop leaves it: checkpoint `ckpt-STEP`, and the replay
        memory of `stored` transitions saved with it (`replay/ckpt-STEP`)."""
        memory = ReplayMemory(((3,), tf.float32), ((1,), tf.float32),
                              fault_injection.REPLAY_CAPACITY, num_agents=4)
        memory.insert({"observ": np.zeros((stored, 3), np.float32),
                       "nextob": np.zeros((stored, 3), np.float32),
                       "action": np.zeros((stored, 1), np.float32),
                       "reward": np.zeros(stored, np.float32),
                       "discount": np.ones(stored, np.float32)})
        checkpoint = tf.train.Checkpoint(other=tf.Variable(1))
        tf.train.CheckpointManager(checkpoint, tmp_path / name, 5).save(checkpoint_number=step)
        if replay:
            tf.train.Checkpoint(replay=memory).write(str(tmp_path / name / "replay" /
                                                         f"ckpt-{step}"))
        return evidence.replay_kept(tmp_path / name, fault_injection.REPLAY_CAPACITY)

    assert saved("kept", 8000) == (
        True, "replay memory at step 8,000: 8,000 transitions (expected 8,000)")
    # A resume at step 5,000 that started with an empty memory.
    assert saved("restarted", 3000)[0] is False
    assert saved("none", 10, replay=False) == (
        False, "no replay memory saved with ckpt-8000 (replay/ckpt-8000)")
    assert evidence.replay_kept(tmp_path / "empty", 10) == (
        False, "no checkpoint to hold the replay memory")


def test_a_report_replaces_its_section_of_the_page_and_keeps_the_rest():
    page = "# Faults\n\nIntro.\n\n## A\n\nold a\n\n## B\n\nold b\n"
    assert fault_injection.with_section(page, "A", "new a\n") == (
        "# Faults\n\nIntro.\n\n## A\n\nnew a\n\n## B\n\nold b\n")
    assert fault_injection.with_section(page, "B", "new b") == (
        "# Faults\n\nIntro.\n\n## A\n\nold a\n\n## B\n\nnew b\n")
    assert fault_injection.with_section(page, "C (new)", "c") == page + "\n## C (new)\n\nc\n"
