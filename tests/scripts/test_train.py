"""The training command line: every shipped config built, one of each kind trained briefly;
real Pendulum runs, stopped by signals and resumed; its one-line errors."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from batchrl import build, configs, environments
from batchrl.drivers.loop import Loop
from batchrl.scripts import train
from batchrl.scripts.events import read_scalars

# A brief run: two train phases of 100 batch steps of 2 agents, an update every 2 episodes
# of at most 50 steps, one eval episode; an off-policy algorithm updates 30 times from step
# 100 on. Neither updates nor whole calls are compiled with XLA (`jit_update`, `jit_step`;
# tests/algorithms/test_ppo.py, test_off_policy.py and test_learning.py compile them): the
# compilation took longer than the run.
BRIEF = {"steps": 400, "eval_every": 200, "log_every": 100, "num_agents": 2,
         "update_every": 2, "update_epochs": 1, "eval_episodes": 1, "max_length": 50,
         "learning_starts": 100, "replay_capacity": 400, "updates_per_step": 0.1,
         "jit_update": False, "jit_step": False, "actors": 0}
# (`actors: 0`: `cartpole_impala` trains in this process here; its actors on Ray are
# trained by tests/distributed/test_on_ray.py, beside the test cluster.)
# Per algorithm, besides BRIEF: appo's minibatches are rows of a batch, and the brief run's
# 2 agents make batches of 2 rows (a config's larger `batch_size` is a config error).
BRIEF_BY_ALGORITHM = {"appo": {"batch_size": "null"}}
# Keys that some algorithm reads: one that the config's algorithm does not read must keep
# its default (`build.algorithm_class`), so `_sets` leaves it out.
_ALGORITHM_KEYS = frozenset().union(
    *(algorithm.config_keys for algorithm in build.ALGORITHMS.values()))


def _sets(name, values):
    """`--set` flags of `values` (key -> value) for config `name`, without the keys of
    other algorithms than its own; with `BRIEF`, also those of `BRIEF_BY_ALGORITHM`."""
    config = configs.load(name)
    read = build.algorithm_class(config).config_keys
    if values is BRIEF:
        values = {**values, **BRIEF_BY_ALGORITHM.get(config.algorithm, {})}
    return [flag for key, value in values.items()
            if key not in _ALGORITHM_KEYS or key in read
            for flag in ("--set", f"{key}={value}")]


TINY = _sets("pendulum", BRIEF)  # Without the keys of the off-policy algorithms.


def _kind(name):
    """What sets a config's training apart: (algorithm, where its environments step,
    network kind: a preset's name, or declared layers / declared per leaf)."""
    config = configs.load(name)
    if environments.native_class(config.env) is not None:
        where = "in-graph"
    elif environments.envpool_task(config.env) is not None:
        where = "envpool"
    else:
        where = config.env_backend
    if isinstance(config.network, str):
        network = config.network
    else:
        network = "declared per leaf" if isinstance(config.network, dict) else "declared"
    return config.algorithm, where, network


def _covering_configs():
    """Few configs among which every algorithm, every place where environments step and
    every network kind of the shipped configs (`_kind`) occurs, so that a new one among the
    configs is trained too: each next one brings the most values not yet covered (the first
    in name order among equals), a greedy set cover, which takes fewer configs than taking
    each that brings a new value in name order."""
    kinds = {name: set(enumerate(_kind(name))) for name in configs.available()}
    everything = set().union(*kinds.values())
    chosen, covered = [], set()
    while covered != everything:
        name = max(kinds, key=lambda name: len(kinds[name] - covered))  # First of equals.
        chosen.append(name)
        covered |= kinds[name]
    return sorted(chosen)


TRAINED = _covering_configs()


@pytest.mark.parametrize("name", [name for name in configs.available() if name not in TRAINED])
def test_every_other_shipped_config_builds_against_its_environment(name):
    """Each config that is not trained below is checked as `train` checks it and its
    algorithm built, networks and optimizers included, on a batch of its environment (a
    network that does not fit the spaces raises here), with a small replay memory, stepped
    in this process, with at most 16 agents (creating 128 EnvPool Pongs for `pong_pqn`
    was most of its time)."""
    config = configs.load(name, _sets(name, {"replay_capacity": 100})[1::2])
    build.check(config)
    environments.check_backend(config)
    config = configs.Config(config, num_agents=min(config.num_agents, 16))
    if config.env_backend in ("processes", "ray"):  # The same environments, stepped here.
        config = configs.Config(config, env_backend="local")
    batch_env = environments.create_batch(config)
    try:
        agent = build.build(config, batch_env, process_eager=False)
    finally:
        batch_env.close()
    assert type(agent.algo) is build.algorithm_class(config)
    assert agent.checkpoint.step is agent.step and agent.algo.checkpoint_state


@pytest.mark.parametrize("name", TRAINED)
def test_configs_of_every_kind_train_briefly(tmp_path, capsys, name):
    """`train` checks and builds the config and trains it briefly (`BRIEF`). In-process (the
    CLI's main), so that TensorFlow starts once for all configs."""
    called = time.time()
    sets = _sets(name, BRIEF)
    assert train.main([f"--config={name}", f"--logdir={tmp_path}", *sets]) == 0
    took = time.time() - called
    assert (tmp_path / "ckpt-400.index").exists()
    assert configs.read_run_config(tmp_path / "config.yaml") == configs.load(name, sets[1::2])
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert list((tmp_path / "eval").glob("events.out.tfevents.*"))
    output = capsys.readouterr().out
    assert "Final eval mean_score" in output and "traces: 1 (train and eval" in output
    # Called in-process, the start-up is counted from the call, not the process's start.
    ready = re.search(r"^Ready to train ([\d.]+) s after the command", output, re.MULTILINE)
    assert ready and 0 < float(ready.group(1)) < took, output


def test_environment_given_as_module_and_class(tmp_path, capsys, monkeypatch):
    """The run directory holds the config.yaml of a run that failed before its first
    checkpoint: no run to resume, the new config is taken. The config is checked once, and
    the run's config.yaml is the config as `configs.load` gave it."""
    (tmp_path / "config.yaml").write_text(configs.dump(configs.load("pendulum")))
    calls = []
    for module, name in ((build, "check"), (train, "check_resume")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, original=original, name=name: (
            calls.append(name), original(*args))[1])
    env = ["--set", "env=batchrl.environments.mock:MockEnvironment",
           "--set", "env_kwargs={observ_shape: [2, 3], action_shape: [2], min_duration: 5, "
                    "max_duration: 20}"]
    assert train.main(["--config=pendulum", f"--logdir={tmp_path}", *TINY, *env]) == 0
    assert "Final eval mean_score" in capsys.readouterr().out
    assert sorted(calls) == ["check", "check_resume"]
    saved = configs.read_run_config(tmp_path / "config.yaml")
    assert saved == configs.load("pendulum", [*TINY, *env][1::2])
    assert saved.env == "batchrl.environments.mock:MockEnvironment"
    assert saved.env_kwargs["observ_shape"] == [2, 3] and saved.num_agents == 2


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
    (["--set", "env_backend=envpool", "--set", "env_kwargs={bogus_option: 1}"],
     "has no option 'bogus_option'"),
    (["--set", "env_backend=envpool", "--set", "env_kwargs={num_threads: -3}"],
     "num_threads (option) must be an int >= 1"),
    (["--set", "env=envpool:Pendulum-v1", "--set", "env_backend=ray"],
     "config keys 'env' (envpool:Pendulum-v1) and 'env_backend' (ray) contradict each other "
     "in --set: write env: Pendulum-v1 and choose the backend with env_backend alone"),
    (["--config=pendulum_native", "--set", "env_backend=ray"],
     "env 'batchrl.native_tasks:Pendulum' is an in-graph environment, stepped in the graph: choose "
     "env_backend local or processes"),
    (["--set", "worker_restarts=1"],
     "'worker_restarts' (1) applies only to env_backend: ray or actors, and env_backend is "
     "local"),
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


SIGNAL_RUN = ["--config=pendulum", *TINY, "--set", "steps=1000000", "--no-progress"]


def _check_ready_line(stdout, logdir, wall_seconds, eval_every):
    """The line before the first step gives start-up + tracing, both also in the event
    files of every eval; the start-up precedes the first eval and lies within the command's
    time."""
    match = re.search(r"^Ready to train ([\d.]+) s after the command: ([\d.]+) s of start-up "
                      r"\(imports, environments, networks\), ([\d.]+) s tracing", stdout,
                      re.MULTILINE)
    assert match, stdout
    total, startup, tracing = (float(value) for value in match.groups())
    assert total == pytest.approx(startup + tracing, abs=0.11)
    assert 0 < startup and total < wall_seconds
    first_step = re.search(r"^step ", stdout, re.MULTILINE)
    assert first_step and stdout.index("Ready to train") < first_step.start(), stdout
    written = read_scalars(logdir / "eval", "time/startup_seconds")
    steps = [scalar.step for scalar in written]
    assert steps == list(range(eval_every, eval_every * len(steps) + 1, eval_every)) != []
    assert all(scalar.value == pytest.approx(startup, abs=0.051) for scalar in written)
    tracing_written = read_scalars(logdir / "eval", "time/tracing_seconds")
    assert tracing_written[0].value == pytest.approx(tracing, abs=0.051)


def test_sigterm_saves_a_checkpoint_and_resume_continues(tmp_path, capsys):
    """In a new process: SIGTERM once training runs; also the start-up of a fresh process,
    counted from its start, and no warning. The resumed run: in this process."""
    logdir = tmp_path / "run"
    args = [*SIGNAL_RUN, f"--logdir={logdir}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    started = time.time()
    process = subprocess.Popen([sys.executable, "-m", "batchrl.scripts.train", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    lines = []
    for line in process.stdout:  # Wait until training runs: the first phases' line.
        lines.append(line)
        if line.startswith("step"):
            break
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    wall_seconds = time.time() - started
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "Stopped at step" in stderr and "Run the same command again" in stderr
    assert "UserWarning" not in stderr
    stopped = int(stderr.split("Stopped at step ")[1].split(";")[0].replace(",", ""))
    assert stopped >= 200 and (logdir / f"ckpt-{stopped}.index").exists()
    _check_ready_line("".join(lines) + stdout, logdir, wall_seconds, eval_every=200)
    more = [arg.replace("steps=1000000", f"steps={stopped + 200}") for arg in args]
    assert train.main(more) == 0
    output = capsys.readouterr().out
    assert f"Resuming {logdir} from {logdir / f'ckpt-{stopped}'} (step {stopped:,})" in output
    assert (logdir / f"ckpt-{stopped + 200}.index").exists()


def test_ctrl_c_in_worker_processes_saves_a_checkpoint_and_exits_with_130(
        tmp_path, capsys, monkeypatch):
    """`env_backend: processes` for a Gymnasium environment, which no shipped config uses
    (the others: `test_configs_of_every_kind_train_briefly`): a first phase trains and
    evaluates. SIGINT, raised in this process once the second train phase is saved, takes
    the handler of SIGTERM (above): the run stops in the eval phase that follows, saves,
    and `main` returns 128 + 2 with the signal handlers given back."""
    saved = []

    def save_then_ctrl_c(loop, save=Loop.save):
        saved.append(save(loop))
        if len(saved) == 2:
            signal.raise_signal(signal.SIGINT)
        return saved[-1]

    monkeypatch.setattr(Loop, "save", save_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    args = [*SIGNAL_RUN, "--set", "env_backend=processes", f"--logdir={tmp_path}"]
    assert train.main(args) == 128 + signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is handler
    assert saved[:2] == [str(tmp_path / "ckpt-200"), str(tmp_path / "ckpt-400")]
    output = capsys.readouterr()
    assert re.search(r"^step +200 .*eval score", output.out, re.MULTILINE), output.out
    assert (f"Stopped at step 400; saved {tmp_path / 'ckpt-400'}. Run the same command "
            f"again") in output.err
    config = configs.read_run_config(tmp_path / "config.yaml")
    assert config.env_backend == "processes" and config.steps == 1000000


def test_non_finite_observation_fails_with_an_error_naming_the_environment(tmp_path, capfd):
    args = ["--config=pendulum", f"--logdir={tmp_path}", *TINY,
            "--set", "env=tests.nan_environment:NanAfterSteps",
            "--set", "env_kwargs={steps: 30}", "--set", "steps=1000"]
    assert train.main(args) == 1
    stderr = capfd.readouterr().err
    assert "error: training failed at step" in stderr
    assert "env 0 returned a non-finite observation" in stderr, stderr
    assert "Traceback (most recent call last)" not in stderr.split("error:")[0]


def test_non_finite_action_on_envpool_fails_with_an_error_naming_the_environment(
        tmp_path, capfd, monkeypatch):
    """EnvPool's batch given a NaN action for environment 1 at its 30th step (the fault of
    `python -m benchmarks.faults --backend envpool`, `benchmarks.faults.actions`): one
    error line naming it; what was written before stays readable."""
    from batchrl.environments.base import BaseBatchEnv
    from benchmarks.faults import actions

    monkeypatch.setattr(BaseBatchEnv, "step", BaseBatchEnv.step)  # Restored after.
    actions.install("nan", 30)
    args = ["--config=pendulum", f"--logdir={tmp_path}", *TINY, "--set",
            "env=envpool:Pendulum-v1", "--set", "env_backend=envpool", "--set", "steps=1000"]
    assert train.main(args) == 1
    stderr = capfd.readouterr().err
    assert "error: training failed at step" in stderr
    assert re.search(r"env 1\b.*was given a non-finite action: \[nan\]", stderr), stderr
    assert "Traceback (most recent call last)" not in stderr.split("error:")[0]
    assert configs.read_run_config(tmp_path / "config.yaml").env == "envpool:Pendulum-v1"


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


@pytest.mark.parametrize("overrides, expected", [
    ({"env_backend": "local"}, 1),
    ({"env_backend": "processes"}, 0),
    ({"env_backend": "ray"}, 0),
    ({"env": "batchrl.native_tasks:Pendulum", "env_backend": "local"}, 0),
    ({"env_backend": "processes", "inter_op_threads": 2}, 2),
    ({"env_backend": "envpool"}, 1),
    ({"env": "envpool:Pendulum-v1"}, 1),
    ({"env_backend": "local", "actors": 1}, 0),  # A learner: environments only to evaluate.
])
def test_inter_op_threads_follow_where_the_environments_run(overrides, expected):
    assert train.inter_op_threads(configs.load("pendulum", overrides)) == expected


def test_training_sets_threads_and_grappler_passes_before_tensorflow_runs():
    """In a new process without BATCHRL_GRAPPLER (a user's): `configure_tensorflow` sizes
    the inter-op pool (1 for Pendulum in this process) and turns two Grappler passes off,
    Grappler itself on, before TensorFlow runs; once it runs, another size warns and is not
    applied. With BATCHRL_GRAPPLER=off, Grappler is off whole."""
    script = (
        "import os\n"
        "import tensorflow as tf\n"
        "from batchrl import configs\n"
        "from batchrl.scripts import train\n"
        "before = tf.config.optimizer.get_experimental_options()\n"
        "train.configure_tensorflow(configs.load('pendulum'))\n"
        "after = tf.config.optimizer.get_experimental_options()\n"
        "print(before.get('layout_optimizer'), before.get('remapping'))\n"
        "print(after['layout_optimizer'], after['remapping'], after['disable_meta_optimizer'])\n"
        "tf.constant(1.0) + 1.0\n"  # TensorFlow runs: the pool is fixed from here on.
        "print(tf.config.threading.get_inter_op_parallelism_threads())\n"
        "train.set_inter_op_threads(0)\n"
        "print(tf.config.threading.get_inter_op_parallelism_threads())\n"
        "os.environ['BATCHRL_GRAPPLER'] = 'Off'\n"
        "train.configure_tensorflow(configs.load('pendulum'))\n"
        "print(tf.config.optimizer.get_experimental_options()['disable_meta_optimizer'])\n")
    environ = {key: value for key, value in os.environ.items() if key != "BATCHRL_GRAPPLER"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "None None", "False False False", "1", "1", "True"]
    assert "inter_op_threads: 0 not applied, TensorFlow already runs" in result.stderr


def test_the_command_starts_the_actors_before_it_imports_tensorflow(tmp_path):
    """`main` of an actor config starts the actors (a stand-in pool) while TensorFlow is
    not imported, then starts TensorFlow, and closes the actors when a check after that
    fails (a stand-in `check`, so that this process needs no TensorFlow; told not to
    repeat the checks made before the actors); a mistake found without TensorFlow starts
    neither, in a config without actors too (an unknown environment id: one line, with no
    `import tensorflow` first). A `module:NAME` algorithm, whose module may import
    TensorFlow, starts TensorFlow first. Nothing is written either way."""
    script = (
        "import sys\n"
        "from batchrl import configs\n"
        "from batchrl.scripts import train\n"
        "events = []\n"
        "class Pool:\n"
        "    def close(self):\n"
        "        events.append('closed')\n"
        "def start_actors(config, setup):\n"
        "    events.append('tensorflow' in sys.modules)\n"
        "    return Pool()\n"
        "def check(config, logdir, checked_before_tensorflow):\n"
        "    events.append(f'checked early: {checked_before_tensorflow}')\n"
        "    raise configs.ConfigError('refused after TensorFlow')\n"
        "train.train_actors.start_actors = start_actors\n"
        "train.start_tensorflow = lambda *args, **kwargs: events.append('tensorflow')\n"
        "train.check = check\n"
        "for name, sets in (('cartpole_impala', ['rollout_length=null']),\n"
        "                   ('cartpole_impala', []),\n"
        "                   ('cartpole_impala', ['algorithm=batchrl.algorithms.impala:IMPALA']),\n"
        "                   ('pendulum', ['env=Pendulum-v9']),\n"
        "                   ('pendulum', [])):\n"
        "    events.clear()\n"
        "    code = train.main(['--config=' + name, '--logdir=' + sys.argv[1],\n"
        "                       *(f'--set={value}' for value in sets)])\n"
        "    print(code, events, 'tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # The checks that passed before the actors started do not run again.
    early = ["False", "'tensorflow'", "'checked early: True'", "'closed'"]
    assert result.stdout.splitlines() == [
        "2 [] False", f"2 [{', '.join(early)}] False",
        "2 ['tensorflow', 'checked early: False'] False",
        "2 [] False", "2 ['tensorflow', 'checked early: True'] False"]
    assert "needs rollout_length" in result.stderr
    assert "unknown Gymnasium environment id 'Pendulum-v9'" in result.stderr
    assert "refused after TensorFlow" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value, off", [
    (None, False), ("on", False), ("1", False), ("off", True), ("OFF", True), ("0", True),
    (" false ", True)])
def test_batchrl_grappler_turns_grappler_off_only_when_it_says_so(value, off):
    assert train.grappler_off({} if value is None else {"BATCHRL_GRAPPLER": value}) is off


def test_help_names_every_algorithm(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("BatchPPO", "TRPO", "A2C", "PQN", "SAC", "TD3", "DQN",
                 "config key algorithm"):
        assert name in text, name
    # The actor modes: the on-policy algorithms' fragments, Ape-X for each off-policy one.
    from batchrl.algorithms import registry

    assert "config key actors" in text and "Ape-X" in text
    for name in registry.names(actors="transitions") + registry.names(actors="fragments"):
        assert name.upper() in text.split("config key actors", 1)[1], name
