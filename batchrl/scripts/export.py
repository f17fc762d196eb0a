"""Exports the policy of a training run as a SavedModel for serving.

`python -m batchrl.scripts.export --logdir=RUN --outdir=DIR` loads RUN/config.yaml and the
latest checkpoint (or `--checkpoint`) and writes what `batchrl.Agent.export` writes (see
`batchrl.export.export_policy`): a SavedModel whose `serving_default` signature maps
`observation` (float32 `[None, ...]`, unnormalized; uint8 for image frames, e.g. Atari's
`[None, 4, 84, 84]` on EnvPool) to the mean `action` in the environment's action space,
with a `sample` signature for sampled actions (dqn's and td3's with their exploration,
`batchrl.export.export_policy`); recurrent policies take and return `state`. TensorFlow's
harmless ERROR lines about uint8 ops are dropped unless `--verbose`
(`batchrl.scripts.quiet`). It loads with `tf.saved_model.load` without batchrl, and no
signature changes a variable, so it converts to TensorFlow Lite
(`tf.lite.TFLiteConverter.from_saved_model`) and to ONNX (tf2onnx) as it is.
"""

import argparse
import contextlib
import sys

from batchrl import configs
from batchrl.scripts import quiet
from batchrl.scripts.train import start_tensorflow
from batchrl.scripts.visualize import find_run


def export_run(config, checkpoint, outdir, seed=0):
    """Writes the policy of `config` restored from `checkpoint` as a SavedModel to `outdir`.

    The spaces are those of one environment of the config: for an EnvPool task (`env:
    envpool:TASK`, Atari's included) those of EnvPool's spec (`envpool.task_spaces`: the
    observations as the task gives them, uint8 frames for Atari, and the task's own action
    space), no environment built; otherwise of one environment created in this process (an
    in-graph environment through its Gymnasium twin, as `visualize` does), the actions
    mapped into the unwrapped environment's action space. A nested observation or action
    space is the environment's own, one input or output per leaf
    (`batchrl.export.export_policy`). With a `frame_stack` step, the model takes the
    stacked frames, as the policy was trained on them.

    Args:
      config: the run's validated `Config` (`find_run`).
      checkpoint: the checkpoint prefix to restore, e.g. `RUN/ckpt-20000`.
      outdir: where to write the SavedModel.
      seed: int, the seed of the `sample` signature's random ops.

    Returns:
      `outdir`, as given.

    Raises:
      ConfigError: an in-graph environment without a Gymnasium twin, or the checkpoint
        does not fit.
    """
    from batchrl import build as build_lib
    from batchrl import export as export_lib
    from batchrl.environments.frame_stack import stacked_space
    from batchrl.networks import spec as network_spec
    from batchrl.scripts.visualize import restore

    build_lib.check(config)
    with contextlib.ExitStack() as stack:
        batch_env, observation_space, action_space = _environment(config, stack)
        agent = build_lib.build(config, batch_env)
        restore(agent, checkpoint)
        frames = network_spec.plan(config.preprocessing).frames
        if frames:  # The policy takes the stacked frames (`frame_stack`).
            observation_space = stacked_space(observation_space, frames)
        export_lib.export_policy(agent.algo, observation_space, action_space, outdir, seed)
    return outdir


def _environment(config, stack):
    """`(batch_env, observation_space, action_space)`: a batch of one environment of the
    config to build the policy on (closed when the `contextlib.ExitStack` `stack` closes),
    and the spaces the exported model takes and returns (see `export_run`)."""
    from batchrl import environments
    from batchrl.environments import envpool as envpool_env
    from batchrl.environments.application import ApplicationBatchEnv
    from batchrl.environments.local import BatchEnv

    task = environments.envpool_task(config.env)
    if task is not None:
        _, _, options = environments.envpool_settings(config)
        observation_space, policy_action_space, action_space = envpool_env.task_spaces(
            task, options)
        batch_env = ApplicationBatchEnv(1, observation_space, policy_action_space)
        return batch_env, observation_space, action_space
    env_id = environments.gymnasium_id(config.env)
    if env_id is None:
        raise configs.ConfigError(
            f"cannot export {config.env}: the in-graph environment names no Gymnasium "
            f"environment (its class's gymnasium_id) to take the spaces from")
    env = environments.create(env_id, environments.episode_limit(config),
                              kwargs=config.env_kwargs)
    batch_env = stack.enter_context(contextlib.closing(BatchEnv([env], blocking=True)))
    return (batch_env,) + _environment_spaces(env)


def _environment_spaces(env):
    """The spaces of the environment `env` wraps (`environments.create`): a nested space as
    the environment declares it, the action space before the rescaling to [-1, 1]."""
    from batchrl.spaces import nested

    observation_space = env.observation_space
    if isinstance(observation_space, nested.FlatObservationSpace):
        observation_space = observation_space.space
    action_space = env.action_space
    if isinstance(action_space, nested.FlatActionSpace):
        action_space = action_space.space
    else:
        action_space = env.unwrapped.action_space
    return observation_space, action_space


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m batchrl.scripts.export",
        description="Export the policy of a training run as a SavedModel: serving_default "
                    "maps 'observation' to the mean 'action', 'sample' to a sampled one "
                    "(dqn, td3: with their exploration; recurrent policies also take and "
                    "return 'state'). Loads with "
                    "tf.saved_model.load, without batchrl.")
    parser.add_argument("--logdir", required=True,
                        help="the run directory written by batchrl.scripts.train")
    parser.add_argument("--outdir", required=True, help="where the SavedModel goes")
    parser.add_argument(
        "--checkpoint", default=None, metavar="PATH",
        help="checkpoint prefix to load, e.g. LOGDIR/ckpt-20000 (default: the latest)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the 'sample' signature's random ops "
                             "(default: %(default)s)")
    quiet.add_verbose_flag(parser)
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        start_tensorflow(args.verbose)  # Before find_run, which imports TensorFlow.
        config, checkpoint = find_run(args.logdir, args.checkpoint)
        # uint8 ops (image observations) log harmless ERROR lines; a quiet run drops them.
        with quiet.filtered_stderr(quiet.HARMLESS_LOG_LINES,
                                   enabled=not args.verbose and quiet.is_quiet()):
            export_run(config, checkpoint, args.outdir, args.seed)
    except configs.ConfigError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(f"Exported the policy of {checkpoint} ({config.env}) to {args.outdir}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
