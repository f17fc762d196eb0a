"""The visualize command line on real (very short) Pendulum runs, and its one-line errors.

The commands run in this process (`main(argv)`: TensorFlow starts once); `--help` runs as a
program."""

import json
import os
import re
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

from batchrl.scripts import train, visualize

# A recurrent policy (its state carried from step to step), two agents, 50-step episodes,
# an update every 2 episodes: 2 updates, an eval and a checkpoint.
TRAIN = ["--config=pendulum", "--no-progress", "--set", "env_backend=local",
         "--set", "steps=200", "--set", "eval_every=200", "--set", "num_agents=2",
         "--set", "max_length=50", "--set", "update_every=2", "--set", "update_epochs=1",
         "--set", "eval_episodes=1", "--set", "network=recurrent_gaussian",
         "--set", "policy_layers=[16]", "--set", "value_layers=[16]",
         "--set", "chunk_length=50", "--set", "batch_size=4"]
EPISODE = re.compile(
    r"^episode (\d+): return (-?[\d.]+), length (\d+) steps, video (\S+)$", re.MULTILINE)


def _visualize(capsys, *args):
    """`visualize.main(args)`: its exit code, stdout and stderr."""
    capsys.readouterr()
    code = visualize.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The one run of the tests (`TRAIN`): its checkpoint holds one recurrent state per
    training agent (2), of which visualize plays one."""
    logdir = tmp_path_factory.mktemp("visualize") / "run"
    assert train.main([f"--logdir={logdir}", *TRAIN]) == 0
    return logdir


def test_records_a_readable_video_and_the_returns(run_dir, tmp_path, capsys):
    """The return printed is that of a replay of the policy carrying its recurrent state."""
    outdir = tmp_path / "videos"
    code, out, err = _visualize(capsys, f"--logdir={run_dir}", f"--outdir={outdir}",
                                "--episodes=1", "--max-steps=40")
    assert code == 0, err
    episodes = EPISODE.findall(out)
    assert len(episodes) == 1, out
    index, printed_return, length, video = episodes[0]
    assert index == "0" and int(length) == 40  # Pendulum never terminates: the cap ends it.
    assert video == str(outdir / "episode-000.mp4")
    with imageio.get_reader(video) as reader:
        assert reader.get_meta_data()["fps"] == 30  # Pendulum's metadata["render_fps"].
        frames = [frame for frame in reader]
    assert len(frames) == int(length)
    assert all(frame.shape == (500, 500, 3) for frame in frames)
    assert len({frame.tobytes() for frame in frames}) > 1  # The pendulum moves.
    records = json.loads((outdir / "returns.json").read_text())
    assert len(records) == 1
    assert records[0]["episode"] == 0 and records[0]["length"] == int(length)
    assert records[0]["video"] == "episode-000.mp4"
    assert f"{records[0]['return']:.2f}" == printed_return
    assert records[0]["return"] == pytest.approx(_replayed_return(run_dir, 40), rel=1e-4)
    assert not list(outdir.glob("*.partial.mp4"))


def _replayed_return(run_dir, steps):
    """The return of the run's mean-action policy over `steps` steps of Pendulum-v1 from
    the run's seed, played here without `simulate`: the reference for visualize's."""
    import tensorflow as tf

    from batchrl import build, environments
    from batchrl.environments.local import BatchEnv

    config, checkpoint = visualize.find_run(run_dir)
    batch_env = BatchEnv([environments.create(config.env, steps)], blocking=True)
    batch_env.reset(seed=config.seed)
    built = build.build(config, batch_env)
    visualize.restore(built, checkpoint)
    observ, _ = batch_env.reset()  # simulate's first call begins an episode: a reset.
    state = tf.zeros([1, built.algo.state_size])
    total = 0.0
    for _ in range(steps):
        action, state = built.algo.policy_action(tf.constant(observ), state)
        observ, reward, _, _, _ = batch_env.step(action.numpy())
        total += float(reward[0])
    batch_env.close()
    return total


def _assert_one_line_error(capsys, message, *args):
    """`visualize.main(args)` fails with exit code 2 and one line on stderr that holds
    `message`."""
    code, _, err = _visualize(capsys, *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


def test_missing_run_directory_is_a_one_line_error(tmp_path, capsys):
    _assert_one_line_error(capsys, "does not exist", f"--logdir={tmp_path / 'nope'}",
                           f"--outdir={tmp_path / 'o'}")
    assert not (tmp_path / "o").exists()


def test_directory_without_config_is_a_one_line_error(tmp_path, capsys):
    _assert_one_line_error(capsys, "holds no config.yaml", f"--logdir={tmp_path}",
                           f"--outdir={tmp_path / 'o'}")


def test_run_without_checkpoint_is_a_one_line_error(run_dir, tmp_path, capsys):
    logdir = tmp_path / "untrained"
    logdir.mkdir()
    (logdir / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    _assert_one_line_error(capsys, "holds no checkpoint", f"--logdir={logdir}",
                           f"--outdir={tmp_path / 'o'}")
    _assert_one_line_error(capsys, "ckpt-5 does not exist", f"--logdir={run_dir}",
                           f"--outdir={tmp_path / 'o'}", f"--checkpoint={run_dir / 'ckpt-5'}")
    assert not (tmp_path / "o").exists()


def test_help_names_the_options():
    """As a program: `python -m batchrl.scripts.visualize --help`."""
    result = subprocess.run([sys.executable, "-m", "batchrl.scripts.visualize", "--help"],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0
    for option in ("--logdir", "--outdir", "--episodes", "--checkpoint", "--max-steps"):
        assert option in result.stdout


def _copy_run(run_dir, logdir, edit_config):
    """Copies the files of `run_dir` into `logdir`, its config.yaml through `edit_config`
    (a function of the text)."""
    logdir.mkdir()
    for path in run_dir.iterdir():
        if path.is_file():
            (logdir / path.name).write_bytes(path.read_bytes())
    config = logdir / "config.yaml"
    config.write_text(edit_config(config.read_text()))


def test_checkpoint_of_another_network_is_a_one_line_error(run_dir, tmp_path, capsys):
    logdir = tmp_path / "other"
    _copy_run(run_dir, logdir, lambda text: re.sub(
        r"policy_layers:\n(- \d+\n)+", "policy_layers:\n- 7\n", text))
    _assert_one_line_error(capsys, "does not fit the agent of the run's config",
                           f"--logdir={logdir}", f"--outdir={tmp_path / 'o'}")


def test_envpool_task_without_a_gymnasium_twin_is_a_one_line_error(run_dir, tmp_path, capsys):
    logdir = tmp_path / "dmc"
    _copy_run(run_dir, logdir, lambda text: text.replace(
        "env: Pendulum-v1", "env: envpool:CheetahRun-v1"))
    _assert_one_line_error(capsys, "cannot render envpool:CheetahRun-v1: EnvPool has no "
                                   "renderer, Gymnasium has no environment of the id "
                                   "'CheetahRun-v1', and its observations are not images",
                           f"--logdir={logdir}", f"--outdir={tmp_path / 'o'}")


@pytest.mark.parametrize("env, edits", [
    ("batchrl.native_tasks:Pendulum", {"jit_step: false": "jit_step: true"}),  # pendulum_native's.
    # A run of pendulum_native saved before its module's old name, batchrl.envs, changed.
    ("batchrl.envs:Pendulum", {"jit_step: false": "jit_step: true"}),
    ("envpool:Pendulum-v1", {}),
])
def test_in_graph_and_envpool_environments_are_rendered_through_gymnasium(
        run_dir, tmp_path, capsys, env, edits):
    """The run's checkpoint under a config of the in-graph or EnvPool twin of Pendulum-v1
    (the same spaces: the same networks), as a run of that config writes it; the in-graph one
    also under its module's old name, as an older run wrote it."""
    logdir = tmp_path / "run"

    def edit(text):
        for old, new in {"env: Pendulum-v1": f"env: {env}", **edits}.items():
            assert old in text
            text = text.replace(old, new)
        return text
    _copy_run(run_dir, logdir, edit)
    code, out, err = _visualize(capsys, f"--logdir={logdir}", f"--outdir={tmp_path / 'videos'}",
                                "--episodes=1", "--max-steps=5")
    assert code == 0, err
    (_, _, length, video), = EPISODE.findall(out)
    with imageio.get_reader(video) as reader:
        frames = [frame for frame in reader]
    assert int(length) == len(frames) == 5
    assert all(frame.shape == (500, 500, 3) for frame in frames)  # Pendulum-v1's frames.


def test_an_observation_shows_its_newest_frame():
    stack = np.stack([np.full((6, 8), value, np.uint8) for value in (10, 20, 30, 40)])
    np.testing.assert_array_equal(visualize.observation_frame(stack), np.full((6, 8, 3), 40))
    np.testing.assert_array_equal(visualize.observation_frame(np.moveaxis(stack, 0, -1)),
                                  np.full((6, 8, 3), 40))  # Stacked channels last.
    rgb = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    np.testing.assert_array_equal(visualize.observation_frame(rgb), rgb)


def test_small_and_float_frames_become_uint8_frames_of_at_least_160_pixels():
    minatar = np.zeros((10, 10, 3), np.float64)
    minatar[2, 3] = (1.0, 0.5, 0.0)
    frame = visualize.video_frame(minatar)
    assert frame.dtype == np.uint8 and frame.shape == (160, 160, 3)
    np.testing.assert_array_equal(frame[32:48, 48:64], np.full((16, 16, 3), [255, 128, 0]))
    assert frame[:32].max() == 0
    rng = np.random.default_rng(0)
    # Atari's 84 x 84 observations each pixel 2 x 2, ReachAndChoose's 64 x 64 3 x 3.
    for size, factor in ((84, 2), (64, 3)):
        image = rng.integers(0, 256, (size, size, 3), np.uint8)
        expected = np.zeros((size * factor, size * factor, 3), np.uint8)
        for row in range(factor):
            for column in range(factor):
                expected[row::factor, column::factor] = image
        np.testing.assert_array_equal(visualize.video_frame(image), expected)
    frame = np.full((500, 500, 3), 7, np.uint8)  # Pendulum's, as it is.
    np.testing.assert_array_equal(visualize.video_frame(frame), frame)
