"""What the Loop tests share: a Loop of BatchPPO on small MockEnvironment batches."""

import tensorflow as tf

from batchrl import configs
from batchrl.algorithms.ppo import PPO
from batchrl.drivers.loop import Loop
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.networks import feed_forward_gaussian


def mock_batch(count, durations, seed=0):
    """`count` MockEnvironments (observations `[3]`, actions `[1]`, episodes of `durations`
    = (fewest, most) steps), env i seeded `seed + i`, as one in-graph batch."""
    envs = [MockEnvironment((3,), (1,), *durations) for _ in range(count)]
    for index, env in enumerate(envs):
        env.reset(seed=seed + index)
    return InGraphBatchEnv(BatchEnv(envs, blocking=True))


def ppo_loop(logdir, batch_env, layers, max_length, settings=(), **loop_args):
    """A Loop of BatchPPO (`policy_layers` and `value_layers` = `[layers]`, episodes of at
    most `max_length` steps, the default config with `settings`, a dict) on `batch_env`,
    logging every 20 steps; `loop_args` go to `Loop`. Returns `(loop, algo, step,
    checkpoint)`."""
    config = configs.load("default", {"policy_layers": [layers], "value_layers": [layers],
                                      **dict(settings)})
    config.update(network=feed_forward_gaussian, max_length=max_length)
    step, is_training, should_log = (tf.Variable(0, dtype=tf.int64), tf.Variable(True),
                                     tf.Variable(True))
    algo = PPO(batch_env, step, is_training, should_log, config)
    checkpoint = tf.train.Checkpoint(step=step, **algo.checkpoint_state)
    loop = Loop(logdir, batch_env, algo, step, is_training, should_log, checkpoint,
                log_every=20, progress=False, **loop_args)
    return loop, algo, step, checkpoint
