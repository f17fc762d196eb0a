"""The training command line on real Pendulum runs, and its one-line errors."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from batchrl import configs
from batchrl.scripts import train
from batchrl.scripts.events import read_scalars

SHORT = ["--set", "steps=2000", "--set", "eval_every=1000", "--set", "log_every=500",
         "--set", "eval_episodes=2", "--set", "num_agents=4", "--set", "update_every=4",
         "--set", "update_epochs=2"]


def _train(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "batchrl.scripts.train", *args],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.parametrize("env_backend, env", [
    ("local", "Pendulum-v1"), ("processes", "Pendulum-v1"), ("envpool", "envpool:Pendulum-v1")])
def test_short_pendulum_run_writes_the_run_directory_and_resumes(tmp_path, env_backend, env):
    logdir = tmp_path / "run"
    backend = ["--set", f"env_backend={env_backend}"]
    started = time.time()
    result = _train("--config=pendulum", f"--logdir={logdir}", *SHORT, *backend)
    wall_seconds = time.time() - started
    assert result.returncode == 0, result.stderr
    assert "Final eval mean_score" in result.stdout
    assert "tf.function traces: 1 (train and eval phases share it" in result.stdout
    assert "UserWarning" not in result.stderr
    _check_ready_line(result.stdout, logdir, wall_seconds)
    saved = configs.read_run_config(logdir / "config.yaml")
    assert saved.steps == 2000 and saved.env == env and saved.env_backend == env_backend
    assert (logdir / "ckpt-2000.index").exists()
    assert list((logdir / "train").glob("events.out.tfevents.*"))
    assert list((logdir / "eval").glob("events.out.tfevents.*"))
    # The same command with more steps resumes from the checkpoint.
    more = [arg.replace("steps=2000", "steps=3000") for arg in SHORT]
    result = _train("--config=pendulum", f"--logdir={logdir}", *more, *backend)
    assert result.returncode == 0, result.stderr
    assert "Resuming" in result.stdout and "step 2,000" in result.stdout
    assert (logdir / "ckpt-3000.index").exists()


def _check_ready_line(stdout, logdir, wall_seconds):
    """The line before the first step gives start-up + tracing, both also in the event
    files; the start-up precedes the first eval and lies within the command's time."""
    match = re.search(r"^Ready to train ([\d.]+) s after the command: ([\d.]+) s of start-up "
                      r"\(imports, environments, networks\), ([\d.]+) s tracing", stdout,
                      re.MULTILINE)
    assert match, stdout
    total, startup, tracing = (float(value) for value in match.groups())
    assert total == pytest.approx(startup + tracing, abs=0.11)
    assert 0 < startup and total < wall_seconds
    assert stdout.index("Ready to train") < stdout.index("step      1,000")
    written = read_scalars(logdir / "eval", "time/startup_seconds")
    assert [scalar.step for scalar in written] == [1000, 2000]
    assert written[0].value == pytest.approx(startup, abs=0.051)
    tracing_written = read_scalars(logdir / "eval", "time/tracing_seconds")
    assert tracing_written[0].value == pytest.approx(tracing, abs=0.051)


TINY = ["--set", "steps=400", "--set", "eval_every=200", "--set", "log_every=100",
        "--set", "num_agents=2", "--set", "update_every=2", "--set", "update_epochs=1",
        "--set", "eval_episodes=1", "--set", "max_length=50"]


@pytest.mark.parametrize("name", configs.available())
def test_every_shipped_config_trains_briefly(tmp_path, capsys, name):
    # In-process (the CLI's main), so that TensorFlow starts once for all configs.
    algorithm = configs.load(name).algorithm
    off_policy = algorithm in ("sac", "td3", "dqn")
    unread = {"update_epochs=1"} if algorithm != "ppo" else set()  # Unread keys are errors.
    unread |= {"update_every=2"} if off_policy else set()
    tiny = [arg for pair in zip(TINY[::2], TINY[1::2], strict=True) if pair[1] not in unread
            for arg in pair]
    if off_policy:  # Updates within the 400 steps, and a memory of no more.
        tiny += ["--set", "learning_starts=100", "--set", "replay_capacity=400"]
    called = time.time()
    assert train.main([f"--config={name}", f"--logdir={tmp_path}", *tiny]) == 0
    took = time.time() - called
    assert (tmp_path / "ckpt-400.index").exists()
    output = capsys.readouterr().out
    assert "Final eval mean_score" in output and "traces: 1 (train and eval" in output
    # Called in-process, the start-up is counted from the call, not the process's start.
    ready = re.search(r"^Ready to train ([\d.]+) s after the command", output, re.MULTILINE)
    assert ready and 0 < float(ready.group(1)) < took, output


def test_environment_given_as_module_and_class(tmp_path):
    env = ["--set", "env=batchrl.environments.mock:MockEnvironment",
           "--set", "env_kwargs={observ_shape: [2, 3], action_shape: [2], min_duration: 5, "
                    "max_duration: 20}"]
    result = _train("--config=pendulum", f"--logdir={tmp_path}", *TINY, *env)
    assert result.returncode == 0, result.stderr
    saved = configs.read_run_config(tmp_path / "config.yaml")
    assert saved.env_kwargs["observ_shape"] == [2, 3]


@pytest.mark.parametrize("args, message", [
    (["--set", "env=batchrl.environments.mock:MockEnvironment"],
     "has no registered time limit: set config key 'max_length'"),
    (["--set", "env=batchrl.tools.nothing:Env"], "cannot import module 'batchrl.tools.nothing'"),
    (["--set", "env=batchrl.environments.mock:Nothing"], "no class or function 'Nothing'"),
    (["--set", "env_kwargs=[1]"], "'env_kwargs' must be a mapping"),
    (["--config=pendulm"], "unknown config 'pendulm'"),
    (["--set", "num_agnts=4"], "unknown config key 'num_agnts'"),
    (["--set", "discount=2"], "'discount' must be between 0 and 1"),
    (["--set", "env=Pendulum-v9"], "unknown Gymnasium environment id 'Pendulum-v9'"),
    (["--set", "env=envpool:Pendulum-v9"],
     "EnvPool has no task 'Pendulum-v9'; close matches: Pendulum-v1"),
    (["--set", "network=lstm"], "unknown network 'lstm'"),
    (["--set", "env_processes=false"], "config key 'env_processes' in --set is replaced by "
                                       "env_backend: write env_backend: local (for false) or "
                                       "env_backend: processes (for true)"),
    (["--set", "env=envpool:Pendulum-v1", "--set", "env_backend=ray"],
     "config keys 'env' (envpool:Pendulum-v1) and 'env_backend' (ray) contradict each other "
     "in --set: write env: Pendulum-v1 and choose the backend with env_backend alone"),
    (["--config=pendulum_native", "--set", "env_backend=ray"],
     "env 'batchrl.envs:Pendulum' is an in-graph environment, stepped in the graph: choose "
     "env_backend local or processes"),
    (["--set", "worker_restarts=1"],
     "'worker_restarts' (1) applies only to env_backend: ray, and env_backend is local"),
    (["--set", "jit_step=true"], "config key 'jit_step' needs an in-graph environment"),
    (["--set", "algorithm=ddpg"], "config key 'algorithm' is 'ddpg'"),
    (["--config=pendulum_sac", "--set", "update_every=5"],
     "config key 'update_every' is not read by algorithm 'sac'"),
    (["--config=cartpole_dqn", "--set", "env=Pendulum-v1"],
     "algorithm 'dqn': dqn needs a Discrete action space; use sac or td3 for Box actions"),
    (["--config=pendulum_sac", "--set", "algorithm=td3",
      "--set", "exploration={type: gaussian, sigma: 0.1}"],
     "algorithm 'td3': exploration gaussian: unknown key(s) sigma; its keys: std"),
    (["--set", "algorithm=batchrl.nothing:X"], "cannot import module 'batchrl.nothing'"),
    (["--set", "optimizer={type: adam}"], "config key 'optimizer' is not read by algorithm "
                                          "'ppo'"),
    (["--config=pendulum_trpo", "--set", "optimizer={type: natural_gradient, line_search: "
      "{max_iter: 3}}"], "'optimizer.line_search' has unknown key 'max_iter' (did you mean "
                         "max_iterations?)"),
    (["--set", "algorithm=trpo", "--set", "value_optimizer={type: adamw}"],
     "'value_optimizer' has unknown type 'adamw'"),
])
def test_user_mistakes_are_one_line_errors(tmp_path, capsys, args, message):
    assert train.main([f"--logdir={tmp_path / 'run'}", *args]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert message in stderr
    assert not (tmp_path / "run").exists()


def test_resuming_with_other_settings_is_refused(tmp_path, capsys):
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "config.yaml").write_text(configs.dump(configs.load("pendulum")))
    (logdir / "checkpoint").write_text('model_checkpoint_path: "ckpt-4000"\n')
    assert train.main(["--config=pendulum", f"--logdir={logdir}", "--set", "num_agents=3"]) == 2
    assert "num_agents: 10 -> 3" in capsys.readouterr().err
    # `eager` is for debugging: a run may be resumed with or without it.
    config = configs.load("pendulum", ["eager=true"])
    train.check_resume(logdir, config)


@pytest.mark.parametrize("name, old_keys", [
    ("pendulum", {"env_processes": False, "env_backend": "local"}),
    ("pendulum_native", {"env_processes": True, "env_backend": "local"}),
    ("cheetah", {"env": "envpool:HalfCheetah-v5", "env_processes": False,
                 "env_backend": "local"}),
    ("dmc_cheetah_run", {"env": "envpool:CheetahRun-v1", "env_processes": True,
                         "env_backend": "local"}),
])
def test_run_of_an_older_release_with_env_processes_resumes(tmp_path, name, old_keys):
    """A run directory written before `env_backend` chose the backend alone (its config.yaml
    has `env_processes`, and `env: envpool:TASK`) resumes with today's config of that name."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    old = {key: value for key, value in configs.load(name).items() if key != "env_backend"}
    (logdir / "config.yaml").write_text(configs.dump({**old, **old_keys}))
    (logdir / "checkpoint").write_text('model_checkpoint_path: "ckpt-4000"\n')
    config = configs.load(name)
    train.check_resume(logdir, config)
    other = "processes" if config.env_backend == "local" else "local"
    with pytest.raises(configs.ConfigError, match=f"env_backend: '{config.env_backend}' -> "
                                                  f"'{other}'"):
        train.check_resume(logdir, configs.load(name, [f"env_backend={other}"]))


def test_run_directory_without_checkpoint_takes_a_new_config(tmp_path):
    """A run that failed before its first checkpoint is no run to resume."""
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "config.yaml").write_text(configs.dump(configs.load("pendulum")))
    assert train.main(["--config=pendulum", f"--logdir={logdir}", "--no-progress",
                       "--set", "num_agents=2", "--set", "steps=400",
                       "--set", "eval_every=400", "--set", "eval_episodes=1"]) == 0
    assert configs.read_run_config(logdir / "config.yaml").num_agents == 2


def test_network_that_does_not_fit_the_spaces_is_a_one_line_error_writing_nothing(
        tmp_path, capsys):
    logdir = tmp_path / "run"
    assert train.main(["--config=pendulum", f"--logdir={logdir}",
                       "--set", "network=feed_forward_categorical"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and stderr.startswith("error: "), stderr
    assert "config key 'network' is 'feed_forward_categorical'" in stderr
    assert "needs a Discrete action space" in stderr
    assert not logdir.exists()


def test_logdir_naming_a_file_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("not a run")
    assert train.main(["--config=pendulum", f"--logdir={path}"]) == 2
    stderr = capsys.readouterr().err
    assert stderr == f"error: --logdir {path} is a file, not a run directory\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_resume_continues(tmp_path, signum):
    logdir = tmp_path / "run"
    args = ["--config=pendulum", f"--logdir={logdir}", "--set", "steps=1000000",
            "--set", "eval_every=2000", "--set", "num_agents=4", "--set", "eval_episodes=2",
            "--set", "update_every=4", "--set", "update_epochs=2", "--no-progress"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen([sys.executable, "-m", "batchrl.scripts.train", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    for line in process.stdout:  # Wait until training runs.
        if line.startswith("step"):
            break
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    assert "Stopped at step" in stderr and "Run the same command again" in stderr
    stopped = int(stderr.split("Stopped at step ")[1].split(";")[0].replace(",", ""))
    assert stopped >= 2000 and (logdir / f"ckpt-{stopped}.index").exists()
    resumed = _train(*[arg.replace("steps=1000000", f"steps={stopped + 400}") for arg in args])
    assert resumed.returncode == 0, resumed.stderr
    assert f"(step {stopped:,})" in resumed.stdout
    assert (logdir / f"ckpt-{stopped + 400}.index").exists()


def test_non_finite_observation_fails_with_an_error_naming_the_environment(tmp_path):
    args = ["--config=pendulum", f"--logdir={tmp_path}", *TINY,
            "--set", "env=tests.nan_environment:NanAfterSteps",
            "--set", "env_kwargs={steps: 30}", "--set", "steps=1000"]
    result = _train(*args)
    assert result.returncode == 1, result.stderr
    assert "error: training failed" in result.stderr
    assert "error: training failed at step" in result.stderr
    assert "env 0 returned a non-finite observation" in result.stderr, result.stderr
    assert "Traceback (most recent call last)" not in result.stderr.split("error:")[0]


@pytest.mark.parametrize("env_backend", ["local", "processes"])
def test_environment_constructor_error_is_one_error_line_naming_the_environment(
        tmp_path, capsys, env_backend):
    args = [f"--logdir={tmp_path}", *TINY, "--set", f"env_backend={env_backend}",
            "--set", "env=batchrl.environments.mock:MockEnvironment",
            "--set", "env_kwargs={observ_shape: [2], action_shape: [1], min_duration: 9, "
                     "max_duration: 3}"]
    assert train.main(args) == 1
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: training failed before the first step: cannot "
                                "create the environments:")
    assert "env 0 (batchrl.environments.mock:MockEnvironment)" in errors[0]


def test_inter_op_threads_are_set_before_tensorflow_runs():
    script = (
        "import tensorflow as tf\n"
        "from batchrl.scripts.train import set_inter_op_threads\n"
        "set_inter_op_threads(1)\n"
        "tf.constant(1.0) + 1.0\n"  # TensorFlow runs: the pool is fixed from here on.
        "print(tf.config.threading.get_inter_op_parallelism_threads())\n"
        "set_inter_op_threads(0)\n"
        "print(tf.config.threading.get_inter_op_parallelism_threads())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1"]
    assert "inter_op_threads: 0 not applied, TensorFlow already runs" in result.stderr


@pytest.mark.parametrize("overrides, expected", [
    ({"env_backend": "local"}, 1),
    ({"env_backend": "processes"}, 0),
    ({"env_backend": "ray"}, 0),
    ({"env": "batchrl.envs:Pendulum", "env_backend": "local"}, 0),
    ({"env_backend": "processes", "inter_op_threads": 2}, 2),
    ({"env_backend": "envpool"}, 1),
    ({"env": "envpool:Pendulum-v1"}, 1),
])
def test_inter_op_threads_follow_where_the_environments_run(overrides, expected):
    assert train.inter_op_threads(configs.load("pendulum", overrides)) == expected


def test_training_turns_off_the_grappler_passes_that_cost_more_than_they_save():
    script = (
        "import tensorflow as tf\n"
        "from batchrl import configs\n"
        "from batchrl.scripts import train\n"
        "before = tf.config.optimizer.get_experimental_options()\n"
        "train.configure_tensorflow(configs.load('pendulum'))\n"
        "after = tf.config.optimizer.get_experimental_options()\n"
        "print(before.get('layout_optimizer'), before.get('remapping'))\n"
        "print(after['layout_optimizer'], after['remapping'], "
        "tf.config.threading.get_inter_op_parallelism_threads())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["None None", "False False 1"]


def test_help_names_every_algorithm(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("BatchPPO", "TRPO", "A2C", "SAC", "TD3", "DQN", "config key algorithm"):
        assert name in text, name
