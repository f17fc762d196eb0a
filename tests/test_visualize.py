"""The visualize command line on a real (very short) Pendulum run, and its one-line errors."""

import json
import os
import re
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

SHORT = ["--set", "steps=1000", "--set", "eval_every=1000", "--set", "num_agents=2",
         "--set", "update_every=2", "--set", "update_epochs=1", "--set", "eval_episodes=1"]
EPISODE = re.compile(
    r"^episode (\d+): return (-?[\d.]+), length (\d+) steps, video (\S+)$", re.MULTILINE)


def _run(module, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", f"batchrl.scripts.{module}", *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("visualize") / "run"
    result = _run("train", "--config=pendulum", f"--logdir={logdir}", *SHORT,
                  "--set", "env_backend=local")
    assert result.returncode == 0, result.stderr
    return logdir


def test_records_a_readable_video_and_the_returns(run_dir, tmp_path):
    outdir = tmp_path / "videos"
    result = _run("visualize", f"--logdir={run_dir}", f"--outdir={outdir}",
                  "--episodes=1", "--max-steps=40")
    assert result.returncode == 0, result.stderr
    episodes = EPISODE.findall(result.stdout)
    assert len(episodes) == 1, result.stdout
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
    from batchrl.scripts import visualize

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


def test_recurrent_policy_plays_with_its_state(tmp_path):
    # The checkpoint holds one recurrent state per training agent (2); one is played here.
    logdir = tmp_path / "run"
    result = _run("train", "--config=pendulum", f"--logdir={logdir}",
                  "--set", "network=recurrent_gaussian", "--set", "policy_layers=[16]",
                  "--set", "chunk_length=50", "--set", "batch_size=4", "--set", "steps=400",
                  "--set", "eval_every=400", "--set", "num_agents=2", "--set", "update_every=2",
                  "--set", "update_epochs=1", "--set", "eval_episodes=0",
                  "--set", "env_backend=local")
    assert result.returncode == 0, result.stderr
    outdir = tmp_path / "videos"
    result = _run("visualize", f"--logdir={logdir}", f"--outdir={outdir}", "--max-steps=5")
    assert result.returncode == 0, result.stderr
    assert [episode[2] for episode in EPISODE.findall(result.stdout)] == ["5"]
    with imageio.get_reader(outdir / "episode-000.mp4") as reader:
        assert reader.count_frames() == 5


def _assert_one_line_error(result, message):
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_missing_run_directory_is_a_one_line_error(tmp_path):
    result = _run("visualize", f"--logdir={tmp_path / 'nope'}", f"--outdir={tmp_path / 'o'}")
    _assert_one_line_error(result, "does not exist")
    assert not (tmp_path / "o").exists()


def test_directory_without_config_is_a_one_line_error(tmp_path):
    result = _run("visualize", f"--logdir={tmp_path}", f"--outdir={tmp_path / 'o'}")
    _assert_one_line_error(result, "holds no config.yaml")


def test_run_without_checkpoint_is_a_one_line_error(run_dir, tmp_path):
    logdir = tmp_path / "untrained"
    logdir.mkdir()
    (logdir / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    result = _run("visualize", f"--logdir={logdir}", f"--outdir={tmp_path / 'o'}")
    _assert_one_line_error(result, "holds no checkpoint")
    result = _run("visualize", f"--logdir={run_dir}", f"--outdir={tmp_path / 'o'}",
                  f"--checkpoint={run_dir / 'ckpt-5'}")
    _assert_one_line_error(result, "ckpt-5 does not exist")
    assert not (tmp_path / "o").exists()


def test_help_names_the_options():
    result = _run("visualize", "--help")
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


def test_checkpoint_of_another_network_is_a_one_line_error(run_dir, tmp_path):
    logdir = tmp_path / "other"
    _copy_run(run_dir, logdir, lambda text: re.sub(
        r"policy_layers:\n(- \d+\n)+", "policy_layers:\n- 7\n", text))
    result = _run("visualize", f"--logdir={logdir}", f"--outdir={tmp_path / 'o'}")
    _assert_one_line_error(result, "does not fit the agent of the run's config")


def test_envpool_task_without_a_gymnasium_twin_is_a_one_line_error(run_dir, tmp_path):
    logdir = tmp_path / "dmc"
    _copy_run(run_dir, logdir, lambda text: text.replace(
        "env: Pendulum-v1", "env: envpool:CheetahRun-v1"))
    result = _run("visualize", f"--logdir={logdir}", f"--outdir={tmp_path / 'o'}")
    _assert_one_line_error(result, "cannot render envpool:CheetahRun-v1: EnvPool has no "
                                   "renderer, Gymnasium has no environment of the id "
                                   "'CheetahRun-v1', and its observations are not images")


def _played(logdir, outdir, steps):
    """`visualize` of one episode of at most `steps` steps of the run in `logdir`: `(length
    it reports, the video's frames, the video's frames per second)`."""
    result = _run("visualize", f"--logdir={logdir}", f"--outdir={outdir}",
                  "--episodes=1", f"--max-steps={steps}")
    assert result.returncode == 0, result.stderr
    (_, _, length, video), = EPISODE.findall(result.stdout)
    with imageio.get_reader(video) as reader:
        return int(length), [frame for frame in reader], reader.get_meta_data()["fps"]


@pytest.mark.parametrize("config, overrides", [
    ("pendulum_native", ["--set", "steps_per_call=10"]),
    ("pendulum", ["--set", "env=envpool:Pendulum-v1"]),
])
def test_in_graph_and_envpool_environments_are_rendered_through_gymnasium(
        tmp_path, config, overrides):
    logdir = tmp_path / "run"
    result = _run("train", f"--config={config}", f"--logdir={logdir}", *SHORT, *overrides)
    assert result.returncode == 0, result.stderr
    length, frames, _ = _played(logdir, tmp_path / "videos", 5)
    assert length == len(frames) == 5
    assert all(frame.shape == (500, 500, 3) for frame in frames)  # Pendulum-v1's frames.


def test_an_observation_shows_its_newest_frame():
    from batchrl.scripts.visualize import observation_frame

    stack = np.stack([np.full((6, 8), value, np.uint8) for value in (10, 20, 30, 40)])
    np.testing.assert_array_equal(observation_frame(stack), np.full((6, 8, 3), 40))
    np.testing.assert_array_equal(observation_frame(np.moveaxis(stack, 0, -1)),
                                  np.full((6, 8, 3), 40))  # Stacked channels last.
    rgb = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    np.testing.assert_array_equal(observation_frame(rgb), rgb)


def test_small_and_float_frames_become_uint8_frames_of_at_least_160_pixels():
    from batchrl.scripts.visualize import video_frame

    minatar = np.zeros((10, 10, 3), np.float64)
    minatar[2, 3] = (1.0, 0.5, 0.0)
    frame = video_frame(minatar)
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
        np.testing.assert_array_equal(video_frame(image), expected)
    frame = np.full((500, 500, 3), 7, np.uint8)  # Pendulum's, as it is.
    np.testing.assert_array_equal(video_frame(frame), frame)
