"""batchrl-tune (batchrl/scripts/tune.py): search spaces, validation, reports, resume, and
short studies (with a stand-in for the training command, and one real one)."""

import argparse
import json
import os
import re
import signal
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from batchrl import configs
from batchrl.scripts import search_space, tune

# Writes the training command's eval scores to RUN_DIR/eval event files as `mean_score`
# (TensorBoard's record format, without importing TensorFlow); trial N scores
# -100 N + step / 1000 + seed, so later trials are worse. Its printed eval lines carry a decoy
# score (+500): the tuner must read the event files, not the output. SIGTERM leaves a
# `terminated` file; FAKE_EXIT=CODE fails at once. FAKE_SLEEP: seconds before each eval;
# FAKE_LATER_SLEEP: instead, for trials after the first, once they have written their first
# eval (so that they are pruned mid-run).
FAKE_TRAINER = '''
import os, pathlib, re, signal, sys, time
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.record_writer import RecordWriter
args = sys.argv[1:]
logdir = pathlib.Path(next(a.split("=", 1)[1] for a in args if a.startswith("--logdir=")))
sets = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--set")
trial = int(re.search(r"trial-(\\d+)", str(logdir))[1])
(logdir / "pid").write_text(str(os.getpid()))
(logdir / "sets").write_text(repr(sets))

def stop(signum, frame):
    (logdir / "terminated").write_text(str(signum))
    sys.exit(128 + signum)

signal.signal(signal.SIGTERM, stop)
if os.environ.get("FAKE_EXIT"):
    print("error: config key 'network' is bad", flush=True)
    sys.exit(int(os.environ["FAKE_EXIT"]))
steps, every = int(sets["steps"]), int(sets["eval_every"])
(logdir / "eval").mkdir(exist_ok=True)
events = RecordWriter(open(logdir / "eval" / f"events.out.tfevents.{time.time():.0f}.fake", "ab"))
for step in range(every, steps + 1, every):
    sleep = os.environ.get("FAKE_SLEEP", "0.02")
    if trial > 0 and step > every:
        sleep = os.environ.get("FAKE_LATER_SLEEP", sleep)
    time.sleep(float(sleep))
    score = -100.0 * trial + step / 1000 + int(sets["seed"])
    events.write(event_pb2.Event(wall_time=time.time(), step=step, summary=scalar_pb(
        "mean_score", score)).SerializeToString())
    events.flush()
    print(f"step {step:>10,}  train score {score:9.1f} (5 episodes, 100 steps/s)  "
          f"eval score {score + 500:9.1f} (2 episodes, 90 steps/s)", flush=True)
'''


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "fake_train.py"
    path.write_text(FAKE_TRAINER)
    return f"{sys.executable} {path}"


def _fake_args(output, fake, *extra, trials=3, seeds=("0", "1")):
    return ["--config=pendulum", "--search", "policy_lr=log:1e-5:1e-3",
            "--search", "policy_layers=cat:[64,64],[32]", "--trials", str(trials),
            "--seeds", *seeds, "--steps", "4000", "--set", "eval_every=1000",
            "--output", str(output), "--trainer", fake, *extra]


def _states(storage, name="pendulum"):
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")
    return [trial.state for trial in study.trials]


@pytest.mark.parametrize("spec, kind, low, high, step, choices", [
    ("float:0.9:0.99", "float", 0.9, 0.99, None, ()),
    ("float:0:1:0.25", "float", 0.0, 1.0, 0.25, ()),
    ("log:1e-5:1e-3", "log", 1e-5, 1e-3, None, ()),
    ("int:5:30", "int", 5, 30, None, ()),
    ("int:4:64:4", "int", 4, 64, 4, ()),
    ("cat:4,8,16", "cat", None, None, None, (4, 8, 16)),
    ("cat:null,50", "cat", None, None, None, (None, 50)),
    ("cat:[64,64],[200,100]", "cat", None, None, None, ([64, 64], [200, 100])),
    ("cat:batchrl.native_tasks:Pendulum, 'a,b', true", "cat", None, None, None,
     ("batchrl.native_tasks:Pendulum", "a,b", True)),
])
def test_every_space_kind_parses(spec, kind, low, high, step, choices):
    param = search_space.parse_spec("key", spec)
    assert (param.kind, param.low, param.high, param.step) == (kind, low, high, step)
    assert param.choices == choices
    assert search_space.parse_spec("key", param.describe()) == param  # Canonical form parses.


@pytest.mark.parametrize("spec, message", [
    ("uniform:1:2", "unknown kind 'uniform'"),
    ("log:0:1e-3", "needs LOW <= HIGH, LOW > 0"),
    ("log:1e-5:1e-3:2", "expected log:LOW:HIGH"),
    ("float:2:1", "needs LOW <= HIGH"),
    ("float:1", "expected float:LOW:HIGH[:STEP]"),
    ("float:a:1", "'a' is not a finite number"),
    ("int:1.5:3", "'1.5' is not an integer"),
    ("int:1:3:0", "STEP > 0"),
    ("cat:", "cat needs at least one value"),
    ("cat:[1,", "not a YAML flow list"),
])
def test_bad_specs_name_the_culprit(spec, message):
    with pytest.raises(configs.ConfigError, match=r"^--search update_epochs=") as error:
        search_space.parse_spec("update_epochs", spec)
    assert message in str(error.value)


def test_space_file_and_search_pairs(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("policy_lr: log:1e-5:1e-3\npolicy_layers: [[64, 64], [32]]\n")
    params = search_space.parse_search(["discount=float:0.9:0.99"], space)
    assert [(p.key, p.kind) for p in params] == [
        ("policy_lr", "log"), ("policy_layers", "cat"), ("discount", "float")]
    assert params[1].choices == ([64, 64], [32])
    with pytest.raises(configs.ConfigError, match="given twice"):
        search_space.parse_search(["policy_lr=log:1e-4:1e-3"], space)
    with pytest.raises(configs.ConfigError, match="expects KEY=KIND"):
        search_space.parse_search(["policy_lr"])
    space.write_text("policy_lr: log:1e-5\n")
    with pytest.raises(configs.ConfigError, match=r"--space .*space.yaml: policy_lr: "):
        search_space.parse_search([], space)


@pytest.mark.parametrize("search, sets, message", [
    (["policy_lrr=log:1e-5:1e-3"], {}, "--search policy_lrr=log:1e-05:0.001: unknown config "
                                       "key 'policy_lrr' (did you mean policy_lr"),
    (["discount=float:0.5:1.5"], {}, "'discount' must be between 0 and 1, got 1.5"),
    (["update_epochs=float:1:4"], {}, "'update_epochs' must be an integer, got 1.0"),
    (["batch_size=cat:4,x"], {}, "'batch_size' must be an integer, got 'x'"),
    (["policy_layers=cat:[64,64],[0]"], {}, "'policy_layers' must be a list of positive"),
    (["policy_lr=log:1e-5:1e-3"], {"num_agnts": 3}, "unknown config key 'num_agnts' in --set"),
    (["policy_lr=log:1e-5:1e-3"], {"discount": 2}, "'discount' must be between 0 and 1"),
    (["seed=int:0:3"], {}, "'seed': give it with --seeds"),
    (["policy_lr=log:1e-5:1e-3"], {"seed": 1}, "'seed': give it with --seeds"),
    (["steps=int:1:3"], {}, "'steps': give it with --steps"),
    (["policy_lr=log:1e-5:1e-3"], {"policy_lr": 1e-4}, "both searched and --set"),
])
def test_validation_against_the_config_system(search, sets, message):
    with pytest.raises(configs.ConfigError) as error:
        search_space.validate("pendulum", sets, search_space.parse_search(search))
    assert message in str(error.value)


def test_validation_returns_the_base_config():
    params = search_space.parse_search(["discount=cat:0.9"])
    base = search_space.validate("cartpole", {"steps": 5000}, params)
    assert base.steps == 5000 and base.env == "CartPole-v1"


def test_a_bad_spec_ends_with_one_error_line_and_exit_code_2(tmp_path, capsys):
    code = tune.main(["--config=pendulum", "--search", "discount=float:0.5:1.5",
                      "--output", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and error.startswith("error: --search discount")
    assert not (tmp_path / "out").exists()  # Nothing started.
    assert tune.main(["--config=pendulm", "--search", "discount=float:0.9:0.99"]) == 2
    assert "unknown config 'pendulm'" in capsys.readouterr().err
    assert tune.main(["--search", "discount=float:0.9:0.99", "--jobs", "999"]) == 2


def test_seed_objectives():
    series = [(1000, -300.0), (2000, -200.0), (3000, -250.0)]
    assert tune.seed_objective(series, "mean") == -250.0
    assert tune.seed_objective(series, "final") == -250.0
    assert tune.seed_objective(series, "best") == -200.0
    assert tune.seed_objective(series, "tail", steps=8000) == -250.0  # None past 6000: the last.
    assert tune.seed_objective(series, "tail", steps=2500) == -225.0  # 2000 and 3000.
    assert tune.seed_objective(series, threshold=-210, steps=3000) == -2000.0
    assert tune.seed_objective(series, threshold=-100, steps=3000) == -6000.0  # Not reached.


def _study_with_trials():
    study = optuna.create_study(direction="maximize", study_name="table")
    attrs = {"overrides": {"policy_lr": 1e-4, "policy_layers": [64, 64]},
             "seed_values": {"0": -300.0, "1": -200.0}, "last_step": 4000}
    distributions = {"policy_lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)}
    study.add_trial(optuna.trial.create_trial(
        value=-250.0, params={"policy_lr": 1e-4}, distributions=distributions, user_attrs=attrs))
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.PRUNED, params={"policy_lr": 1e-5}, distributions=distributions,
        user_attrs={**attrs, "overrides": {"policy_lr": 1e-5, "policy_layers": [32]},
                    "last_step": 1000}, intermediate_values={1000: -900.0}))
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.FAIL, params={"policy_lr": 3e-4}, distributions=distributions))
    return study


def test_trials_table():
    lines = tune.trials_table(_study_with_trials()).splitlines()
    assert lines[0].startswith("| trial | state | params | objective | per seed |")
    assert lines[2].startswith("| 0 | complete | policy_lr=0.0001, policy_layers=[64, 64] | "
                               "-250 | seed 0: -300, seed 1: -200 | 4,000 |")
    assert lines[3].startswith("| 1 | pruned | policy_lr=1e-05, policy_layers=[32] | — |")
    assert "| 1,000 |" in lines[3]
    assert lines[4].startswith("| 2 | fail | policy_lr=0.0003 | — | — | — |")


def test_best_yaml_round_trips_through_configs_load(tmp_path):
    args = argparse.Namespace(config="pendulum", objective="mean", threshold=None, seeds=[0, 1])
    path = tmp_path / "best.yaml"
    best = tune.write_best(_study_with_trials(), args, {"steps": 40000, "eval_every": 10000},
                           path)
    assert best.number == 0
    text = path.read_text()
    assert text.startswith("# Study 'table' (batchrl-tune), best trial 0: objective mean -250")
    loaded = configs.load(str(path))
    named = configs.load("pendulum")
    assert loaded.policy_lr == 1e-4 and loaded.policy_layers == [64, 64]
    assert loaded.steps == 40000 and loaded.eval_every == 10000
    assert loaded.env_backend == "local" and loaded.discount == named.discount
    assert dict(loaded, policy_lr=named.policy_lr, policy_layers=named.policy_layers,
                steps=named.steps, eval_every=named.eval_every) == named
    assert "seed:" not in text and "value_layers" not in text  # Only the keys that matter.
    empty = optuna.create_study(direction="maximize")
    assert tune.write_best(empty, args, {}, tmp_path / "none.yaml") is None
    assert not (tmp_path / "none.yaml").exists()


def test_resume_marks_stale_running_trials_failed(tmp_path, fake):
    storage, wanted = tmp_path / "out" / "study.db", {"config": "pendulum"}
    study, stale = tune.open_study(storage, "pendulum", wanted)
    assert stale == []
    study.ask()  # RUNNING, as a killed session leaves it.
    study.tell(study.ask(), 1.0)
    study, stale = tune.open_study(storage, "pendulum", wanted)
    assert stale == [0] and [t.state for t in study.trials] == [TrialState.FAIL,
                                                                TrialState.COMPLETE]
    with pytest.raises(configs.ConfigError, match="has other settings"):
        tune.open_study(storage, "pendulum", {"config": "cartpole"})


def test_fake_study_prunes_resumes_and_writes_reports(tmp_path, fake, capsys, monkeypatch):
    # Pruned runs are still running when pruned: they would take 60 s more.
    monkeypatch.setenv("FAKE_LATER_SLEEP", "20")
    output = tmp_path / "out"
    args = _fake_args(output, fake, "--startup-trials", "1", "--warmup", "0")
    assert tune.main(args) == 0
    out = capsys.readouterr().out
    assert "[trial 0] start: policy_lr=" in out and "[trial 0] step 1,000 mean eval 1.5" in out
    assert "[trial 1] pruned at step 1,000" in out
    assert _states(output / "study.db") == [TrialState.COMPLETE, TrialState.PRUNED,
                                            TrialState.PRUNED]
    pruned = output / "trial-1" / "seed-0"
    assert (pruned / "terminated").read_text() == str(int(signal.SIGTERM))
    with pytest.raises(ProcessLookupError):  # Nothing left running.
        os.kill(int((pruned / "pid").read_text()), 0)
    sets = eval((output / "trial-0" / "seed-1" / "sets").read_text())
    assert sets["seed"] == "1" and sets["steps"] == "4000" and "policy_lr" in sets
    assert "step      1,000" in (output / "trial-0" / "seed-0" / "train.log").read_text()
    table = (output / "trials.md").read_text()
    assert "| 0 | complete |" in table and "| 2 | pruned |" in table
    best = configs.load(str(output / "best.yaml"))
    assert best.steps == 4000 and best.policy_layers in ([64, 64], [32])
    # The same command with more trials continues the study.
    assert tune.main(_fake_args(output, fake, "--startup-trials", "1", "--warmup", "0",
                                trials=4)) == 0
    assert "3 of 4 trials done" in capsys.readouterr().out
    assert len(_states(output / "study.db")) == 4


def test_a_config_error_of_the_training_command_stops_the_study(tmp_path, fake, capsys,
                                                                 monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "2")
    assert tune.main(_fake_args(tmp_path / "out", fake)) == 2
    error = capsys.readouterr().err  # Either seed's process may end first.
    assert re.search(r"error: seed [01] exited with code 2: error: config key 'network' is bad",
                     error)
    assert _states(tmp_path / "out" / "study.db") == [TrialState.FAIL]


def test_ctrl_c_stops_the_trials_and_the_same_command_resumes(tmp_path, fake, capsys,
                                                            monkeypatch):
    output = tmp_path / "out"
    command = [sys.executable, "-m", "batchrl.scripts.tune",
               *_fake_args(output, fake, "--jobs", "2", trials=2, seeds=["0"])]
    env = dict(os.environ, FAKE_SLEEP="2")  # A run would take 8 s.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    for line in process.stdout:  # Wait until the trials train.
        if "seed 0 step 1,000" in line:
            break
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Run the same command again to resume" in err
    assert set(_states(output / "study.db")) == {TrialState.FAIL}
    for run in output.glob("trial-*/seed-0"):
        assert (run / "terminated").exists()
        with pytest.raises(ProcessLookupError):
            os.kill(int((run / "pid").read_text()), 0)
    # The same command again, in this process (the signal handling above needed its own).
    monkeypatch.setenv("FAKE_SLEEP", "0")
    capsys.readouterr()
    assert tune.main(command[3:]) == 0, capsys.readouterr().err
    assert "0 of 2 trials done" in capsys.readouterr().out
    states = _states(output / "study.db")
    assert states.count(TrialState.FAIL) == 2 and states.count(TrialState.COMPLETE) == 2


def test_tiny_real_study(tmp_path, capsys):
    """The tuner in this process (as the fake studies above), the real training command in
    its processes."""
    output = tmp_path / "out"
    code = tune.main(
        ["--config=cartpole",
         "--search", "policy_lr=log:1e-4:1e-3", "--search", "update_epochs=int:1:2",
         "--trials", "2", "--jobs", "2", "--seeds", "0", "--steps", "1000", "--output", str(output),
         "--set", "eval_every=500", "--set", "eval_episodes=2", "--set", "num_agents=4",
         "--set", "update_every=4", "--set", "log_every=500", "--set", "max_length=50",
         "--set", "policy_layers=[16]", "--set", "value_layers=[16]"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "[trial 0] seed 0 step 1,000 eval" in out
    states = _states(output / "study.db", "cartpole")
    assert len(states) == 2 and set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert "| 0 | complete |" in (output / "trials.md").read_text()
    best = configs.load(str(output / "best.yaml"))
    assert best.env == "CartPole-v1" and best.steps == 1000 and best.policy_layers == [16]
    study = optuna.load_study(study_name="cartpole", storage=f"sqlite:///{output / 'study.db'}")
    complete = [trial for trial in study.trials if trial.state == TrialState.COMPLETE]
    highest = max(complete, key=lambda trial: trial.value)  # The study maximizes the return.
    assert best.policy_lr == highest.params["policy_lr"]
    assert best.update_epochs == highest.params["update_epochs"]
    assert (output / "trial-1" / "seed-0" / "ckpt-1000.index").exists()


def test_pruners():
    median = tune.make_pruner("median", 40000, 10000)
    assert isinstance(median, optuna.pruners.MedianPruner)
    assert median._n_warmup_steps == 10001 and median._n_startup_trials == 5  # Past 1/4.
    assert tune.make_pruner("median", 40000, 10000, warmup=0)._n_warmup_steps == 0
    assert isinstance(tune.make_pruner("hyperband", 40000, 10000),
                      optuna.pruners.HyperbandPruner)
    assert isinstance(tune.make_pruner("none", 40000, 10000), optuna.pruners.NopPruner)


def test_enqueue_config_runs_the_configs_own_values_first(tmp_path, fake, capsys):
    output = tmp_path / "out"
    args = ["--config=pendulum", "--search", "policy_lr=log:1e-5:1e-3",
            "--search", "policy_layers=cat:[64,64],[200,100]", "--enqueue-config",
            "--trials", "2", "--seeds", "0", "--steps", "4000", "--set", "eval_every=1000",
            "--output", str(output), "--trainer", fake]
    assert tune.main(args) == 0
    base = configs.load("pendulum")
    sets = eval((output / "trial-0" / "seed-0" / "sets").read_text())
    assert float(sets["policy_lr"]) == base.policy_lr
    assert sets["policy_layers"] == json.dumps(base.policy_layers)
    study = optuna.load_study(study_name="pendulum",
                              storage=f"sqlite:///{output / 'study.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    # A config value outside its space is one error line, before any trial.
    output = tmp_path / "other"
    assert tune.main(["--config=pendulum", "--search", "policy_lr=log:1e-3:1e-2",
                      "--enqueue-config", "--output", str(output), "--trainer", fake]) == 2
    assert "policy_lr is 0.0003 in the config, outside log:0.001:0.01" in \
        capsys.readouterr().err
    assert not (output / "study.db").exists()


def test_eval_scores_reads_a_runs_eval_event_files(tmp_path):
    import tensorflow as tf

    assert tune.eval_scores(tmp_path) == {}  # No eval folder yet.
    writer = tf.summary.create_file_writer(str(tmp_path / "eval"))
    with writer.as_default():
        tf.summary.scalar("mean_score", -300.5, step=1000)
        tf.summary.scalar("mean_length", 200.0, step=1000)
        tf.summary.scalar("mean_score", -120.25, step=2000)
    writer.flush()
    assert tune.eval_scores(tmp_path) == {1000: -300.5, 2000: -120.25}
