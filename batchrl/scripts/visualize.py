"""Record videos of a trained agent: `python -m batchrl.scripts.visualize --logdir=RUN_DIR
--outdir=OUT_DIR`.

Loads the run's `config.yaml` and its latest checkpoint (or `--checkpoint`), plays the
mean-action policy (`is_training` false) for `--episodes` episodes, one after the other in
a single environment created with `render_mode="rgb_array"` (an EnvPool task that Gymnasium
does not have, as Atari's, in one EnvPool environment whose image observations are the
frames: the newest of each stack, at 60 / `frame_skip` frames per second), and writes into
OUT_DIR:

- `episode-000.mp4`, `episode-001.mp4`, ...: one video per episode (H.264 through
  imageio-ffmpeg) at the environment's `metadata["render_fps"]` (30 when it has none). It
  holds one frame per step: `env.render()` is called from Python after each step, so an
  episode of `length` steps gives `length` frames showing the state after each action (the
  reset state is not shown);
- `returns.json`: a list of `{"episode", "return", "length", "video"}` (the video's file
  name, relative to OUT_DIR), rewritten after each episode.

Each step is one call of one `tf.function` around `batchrl.drivers.simulate.simulate`, as in
training, so the agent acts exactly as in an eval phase (recurrent policies included).

The environment lives in an `ExternalProcess` worker, which never imports TensorFlow:
Mesa's software OpenGL (llvmpipe) calls LLVM, and in a process that has loaded TensorFlow
those calls bind to the LLVM built into `libtensorflow_framework.so` and crash (segfault in
`mjr_makeContext`, seen with TF 2.21 and Mesa 22.3). Frames come back through the pipe.

Rendering works without a display: classic-control environments draw into an off-screen
pygame surface (`SDL_VIDEODRIVER=dummy` is set unless given), MuJoCo ones through EGL
(`MUJOCO_GL=egl` is set unless given; it needs libEGL with an EGL vendor library: Mesa's
software renderer from the Debian packages libegl1, libegl-mesa0 and libgl1-mesa-dri, or a
GPU driver). The worker imports this module, so it sets the same defaults.
"""

import argparse
import functools
import json
import os
import pathlib
import sys
import time

import numpy as np

from batchrl import configs
from batchrl.scripts import quiet
from batchrl.scripts.train import start_tensorflow

# Before anything imports MuJoCo or pygame (they read these when imported); `main` sets
# TF_CPP_MIN_LOG_LEVEL (`batchrl.scripts.quiet`).
os.environ.setdefault("MUJOCO_GL", "egl")  # Off-screen OpenGL without a display.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # No X11/Wayland for pygame's surfaces.

# TensorFlow is imported inside the functions, so that `--help` and errors are instant.

DEFAULT_FPS = 30
# The Atari 2600's frames per second; EnvPool's tasks show one of every `frame_skip`.
ATARI_FPS = 60


def find_run(logdir, checkpoint=None):
    """The run's config and the checkpoint to restore.

    Args:
      logdir: the run directory written by `batchrl.scripts.train`.
      checkpoint: optional checkpoint prefix (e.g. `RUN_DIR/ckpt-20000`) or a directory
        whose latest checkpoint is used; default: the latest checkpoint in `logdir`.

    Returns:
      `(config, path)`: the `Config` read from `logdir/config.yaml` (see
      `configs.read_run_config`) and the checkpoint prefix.

    Raises:
      ConfigError: `logdir` is missing or has no `config.yaml`, the config is not valid, or
        there is no checkpoint.
    """
    logdir = pathlib.Path(logdir)
    if not logdir.is_dir():
        raise configs.ConfigError(f"run directory {logdir} does not exist")
    config_path = logdir / "config.yaml"
    if not config_path.is_file():
        raise configs.ConfigError(
            f"{logdir} holds no config.yaml: is it a run directory of batchrl.scripts.train?")
    config = configs.read_run_config(config_path)
    if checkpoint is None:
        directory = logdir
    elif os.path.isdir(checkpoint):
        directory = pathlib.Path(checkpoint)
    else:
        if not os.path.isfile(f"{checkpoint}.index"):
            raise configs.ConfigError(
                f"checkpoint {checkpoint} does not exist (expected {checkpoint}.index)")
        return config, os.fspath(checkpoint)
    # The `checkpoint` state file lists the latest one; looking for it first keeps this
    # error free of the TensorFlow import.
    if not (directory / "checkpoint").is_file():
        raise configs.ConfigError(f"{directory} holds no checkpoint: train the run first")
    import tensorflow as tf

    path = tf.train.latest_checkpoint(os.fspath(directory))
    if path is None:
        raise configs.ConfigError(
            f"the checkpoint file in {directory} names no existing checkpoint")
    return config, path


def _create_env(env, max_episode_steps, kwargs):
    """The environment in the worker (module-level, so workers import this module's
    rendering defaults before they import MuJoCo or pygame).

    A MuJoCo model with a camera named `track` (Gymnasium's locomotion tasks: it follows
    the body) is rendered through it unless `env_kwargs` choose a camera: Gymnasium 1.4's
    default free camera of HalfCheetah-v5 stays in place while the agent runs away.
    """
    from batchrl import environments

    kwargs = dict(kwargs or {})
    instance = environments.create(
        env, max_episode_steps, render_mode="rgb_array", kwargs=kwargs)
    model = getattr(instance.unwrapped, "model", None)
    if model is None or {"camera_name", "camera_id"} & set(kwargs):
        return instance
    import mujoco

    if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "track") == -1:
        return instance
    instance.close()
    return environments.create(env, max_episode_steps, render_mode="rgb_array",
                               kwargs={**kwargs, "camera_name": "track"})


def restore(agent, path):
    """Restores what acting needs from the checkpoint at `path` into `agent`.

    Optimizer slots and other saved values that acting does not use are ignored.

    Raises:
      ConfigError: the checkpoint does not fit the agent (e.g. other layer sizes).
    """
    import tensorflow as tf

    try:
        agent.checkpoint.restore(path).expect_partial()
    except (ValueError, tf.errors.OpError) as error:  # E.g. another run's checkpoint.
        tf.get_logger().setLevel("ERROR")  # No warnings about the unrestored rest.
        lines = str(error).strip().splitlines()
        raise configs.ConfigError(
            f"checkpoint {path} does not fit the agent of the run's config: "
            f"{lines[0] if lines else type(error).__name__}") from error


def _fps(env):
    fps = env.metadata.get("render_fps")
    return fps if fps else DEFAULT_FPS


# Frames with a side under ENLARGED_FRAME pixels (MinAtar's 10 x 10, Atari's 84 x 84
# observations, ReachAndChoose's 64 x 64) are enlarged, by repeating each pixel, to at
# least ENLARGED_FRAME pixels a side.
ENLARGED_FRAME = 160


def video_frame(image):
    """A rendered frame as the video takes it: uint8 `[h, w, 3]` (a float image in [0, 1]
    scaled to 0–255, one in [0, 255] clipped); a small one (a side under `ENLARGED_FRAME`
    pixels) with each pixel repeated `k` times along both axes, `k` the smallest integer
    that gives its smaller side at least `ENLARGED_FRAME` pixels (10 x 10: 16, 84 x 84:
    2)."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        scale = 255.0 if image.dtype.kind == "f" and image.max() <= 1.0 else 1.0
        image = np.round(np.clip(image * scale, 0.0, 255.0)).astype(np.uint8)
    if min(image.shape[:2]) < ENLARGED_FRAME:
        factor = -(-ENLARGED_FRAME // min(image.shape[:2]))
        image = np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)
    return image


def observation_frame(observ):
    """The picture an image observation shows, for tasks without a renderer (EnvPool's
    Atari): uint8 `[h, w, 3]`. An RGB `[h, w, 3]` image as it is; a grayscale one
    (`[h, w]`, `[h, w, 1]`) in gray; of stacked frames, the newest: the last of a
    channels-first stack (`[k, h, w]`, EnvPool's) or the last channel of a channels-last
    one (`[h, w, k]`, `frame_stack`'s)."""
    observ = np.asarray(observ)
    if observ.ndim == 3 and observ.shape[-1] == 3:
        return observ
    if observ.ndim == 3:
        observ = observ[-1] if observ.shape[0] < observ.shape[-1] else observ[..., -1]
    return np.repeat(observ[..., None], 3, axis=-1)


def _write_json(path, data):
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)


def visualize(config, checkpoint, outdir, episodes=1, max_steps=None, seed=None,
              progress=None, on_episode=None):
    """Plays the mean-action policy of a checkpoint and writes one video per episode.

    Args:
      config: the run's `Config` (`find_run`).
      checkpoint: checkpoint prefix to restore (only the variables that exist are needed).
      outdir: output directory (created if missing); existing videos of the same names are
        replaced.
      episodes: number of episodes (positive int).
      max_steps: cap on the steps (= frames) of each episode; default and upper bound: the
        run's episode limit. A capped episode ends like one hitting its time limit.
      seed: seed of the environment's first reset (default `config.seed`); later episodes
        continue its random generator.
      progress: show a progress bar per episode (None: only on a terminal).
      on_episode: optional callable receiving each episode's record as it is written.

    Returns:
      list of dicts `{"episode": int, "return": float, "length": int (steps),
      "video": str (file name in outdir)}`, also written to `outdir/returns.json`.

    Raises:
      ConfigError: the config names an unknown environment or network, or an EnvPool task
        without a Gymnasium environment of the same id to render it and without image
        observations to show, or the checkpoint does not fit the agent of the config
        (variables of other shapes).
    """
    import imageio.v2 as imageio
    import tensorflow as tf
    import tqdm

    from batchrl import build as build_lib
    from batchrl import environments
    from batchrl.drivers.simulate import episode_state, simulate
    from batchrl.environments.local import BatchEnv
    from batchrl.environments.wrappers import ExternalProcess

    build_lib.check(config)
    limit = environments.episode_limit(config)
    limit = min(max_steps, limit) if max_steps else limit
    seed = config.seed if seed is None else seed
    # An in-graph or EnvPool environment is rendered through its Gymnasium equivalent (the
    # same dynamics); EnvPool's keyword arguments are its own, not Gymnasium's. An EnvPool
    # task without one (Atari) shows its image observations.
    env_id = environments.gymnasium_id(config.env)
    if env_id is None:
        batch_env = _envpool_of_images(config, limit, seed)
        fps = ATARI_FPS / int(config.env_kwargs.get("frame_skip", 4))
    else:
        kwargs = None if environments.envpool_task(config.env) else config.env_kwargs
        env = ExternalProcess(functools.partial(_create_env, env_id, limit, kwargs),
                              name=f"{env_id} (rendering)")
        batch_env = BatchEnv([env], blocking=False)
        fps = _fps(env)
    try:
        if env_id is not None:
            batch_env.reset(seed=seed)
        agent = build_lib.build(config, batch_env)
        if env_id is None:
            def render():
                return observation_frame(agent.batch_env.observ.numpy()[0])
        else:
            render = env.render
        restore(agent, checkpoint)
        agent.is_training.assign(False)
        agent.should_log.assign(False)
        episode_state(agent.batch_env)  # Variables exist before the trace.

        @tf.function(input_signature=[tf.TensorSpec([], tf.bool)], autograph=False)
        def step_function(reset):
            return simulate(agent.batch_env, agent.algo, False, reset)

        outdir = pathlib.Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        records = []
        reset = True
        for episode in range(episodes):
            name = f"episode-{episode:03d}.mp4"
            partial = outdir / f"episode-{episode:03d}.partial.mp4"
            # Even sizes for H.264 (yuv420p); the environments' 500x500 and 480x480 frames
            # are written unscaled.
            writer = imageio.get_writer(partial, fps=fps, macro_block_size=2)
            bar = tqdm.tqdm(total=limit, desc=f"episode {episode}", unit="frame",
                            leave=False, dynamic_ncols=True,
                            disable=None if progress is None else not progress)
            length, done, complete = 0, False, False
            try:
                while not done:
                    done, score = step_function(tf.constant(reset))
                    reset = False
                    done, score = bool(done.numpy()[0]), float(score.numpy()[0])
                    writer.append_data(video_frame(render()))
                    length += 1
                    bar.update(1)
                writer.close()
                complete = True
            finally:
                bar.close()
                if not complete:  # Interrupted or failed: no half-written video is left.
                    writer.close()
                    partial.unlink(missing_ok=True)
            os.replace(partial, outdir / name)
            record = {"episode": episode, "return": score, "length": length, "video": name}
            records.append(record)
            _write_json(outdir / "returns.json", records)
            if on_episode:
                on_episode(record)
        return records
    finally:
        batch_env.close()


def _envpool_of_images(config, limit, seed):
    """One EnvPool environment of the config's task, for a task Gymnasium cannot render.

    Raises:
      ConfigError: the task is not an EnvPool one, or its observations are not images.
    """
    from batchrl import environments

    task = environments.envpool_task(config.env)
    space = None
    if task:
        batch_env = environments.create_batch(configs.Config(
            config, num_agents=1, seed=seed, max_length=limit))
        space = batch_env.observation_space
        if getattr(space, "dtype", None) == np.uint8 and len(space.shape) >= 2:
            return batch_env
        batch_env.close()
    raise configs.ConfigError(
        f"cannot render {config.env}: EnvPool has no renderer, Gymnasium has no environment "
        f"of the id {task!r}, and its observations are not images"
        + (f" ({space})" if space is not None else ""))


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m batchrl.scripts.visualize",
        description="Record videos of a trained agent: loads LOGDIR/config.yaml and the "
                    "latest checkpoint, plays the mean-action policy and writes one MP4 per "
                    "episode (episode-000.mp4, ...) and returns.json into OUTDIR. Renders "
                    "off-screen (MuJoCo through EGL: MUJOCO_GL=egl unless set).")
    parser.add_argument("--logdir", required=True,
                        help="the run directory written by batchrl.scripts.train")
    parser.add_argument("--outdir", required=True,
                        help="where the videos and returns.json go (created if missing)")
    parser.add_argument("--episodes", type=_positive_int, default=1,
                        help="episodes to record, one video each (default: %(default)s)")
    parser.add_argument(
        "--checkpoint", default=None, metavar="PATH",
        help="checkpoint prefix to load, e.g. LOGDIR/ckpt-20000, or a directory to take "
             "its latest checkpoint (default: the latest in LOGDIR)")
    parser.add_argument(
        "--max-steps", type=_positive_int, default=None,
        help="cap each episode (and its video) at this many steps (default: the run's "
             "episode limit)")
    parser.add_argument(
        "--seed", type=int, default=None,
        help="seed of the environment's first reset (default: the run's seed)")
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress bar (default: only when the output is a terminal)")
    quiet.add_verbose_flag(parser)
    return parser


def _error(error):
    """Prints `error: MESSAGE` as one line on stderr; returns the exit code 2."""
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        start_tensorflow(args.verbose)  # Before find_run, which imports TensorFlow.
        config, checkpoint = find_run(args.logdir, args.checkpoint)
        from batchrl import build as build_lib

        build_lib.check(config)
    except configs.ConfigError as error:
        return _error(error)
    print(f"Recording {args.episodes} episode(s) of {config.env} from {checkpoint} into "
          f"{args.outdir}.", flush=True)
    start = time.time()

    def report(record):
        print(f"episode {record['episode']}: return {record['return']:.2f}, length "
              f"{record['length']} steps, video {os.path.join(args.outdir, record['video'])}",
              flush=True)

    try:
        # uint8 ops (image observations) log harmless ERROR lines; a quiet run drops them.
        with quiet.filtered_stderr(quiet.HARMLESS_LOG_LINES,
                                   enabled=not args.verbose and quiet.is_quiet()):
            records = visualize(config, checkpoint, args.outdir, episodes=args.episodes,
                                max_steps=args.max_steps, seed=args.seed,
                                progress=args.progress, on_episode=report)
    except KeyboardInterrupt:
        print(f"\nInterrupted; finished episodes are listed in "
              f"{os.path.join(args.outdir, 'returns.json')}.", file=sys.stderr)
        return 130
    except configs.ConfigError as error:
        return _error(error)
    frames = sum(record["length"] for record in records)
    print(f"Wrote {len(records)} video(s) and {os.path.join(args.outdir, 'returns.json')} "
          f"({frames:,} frames in {time.time() - start:.1f} s).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
