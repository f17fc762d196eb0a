"""MinAtar's Breakout as TensorFlow graph operations."""

import tensorflow as tf
from gymnasium import spaces

from batchrl.environments.native.base import NativeBatchEnv

_SIZE = 10  # The board is 10 x 10 cells.
_BRICK_ROWS = (1, 4)  # Rows 1 to 3 hold the bricks.
_BRICKS = (_BRICK_ROWS[1] - _BRICK_ROWS[0]) * _SIZE
# State columns before the bricks.
_BALL_X, _BALL_Y, _DIRECTION, _PADDLE, _LAST_X, _LAST_Y, _STRIKE, _LAST_ACTION = range(8)
# The ball's steps of each direction 0-3 (up-left, up-right, down-right, down-left), and
# the directions it takes when reflected by a side wall, by the ceiling, a brick or the
# paddle's middle, and by the paddle's edge (MinAtar's breakout.py).
_DX, _DY = (-1, 1, 1, -1), (-1, -1, 1, 1)
_SIDE, _BOUNCE, _EDGE = (1, 0, 3, 2), (3, 2, 1, 0), (2, 3, 0, 1)
# The paddle's move of each action of the minimal set: no-op, left, right.
_MOVE = (0, -1, 1)


class MinAtarBreakout(NativeBatchEnv):
    """A batch of MinAtar's Breakout (`MinAtar/Breakout-v1`: the minimal action set, sticky
    actions), stepped in the graph.

    Young and Tian, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
    Reinforcement Learning Experiments", arXiv:1903.03176. The rules of the `minatar`
    package's `environments/breakout.py` and `environment.py`:

    - a 10 x 10 board; a paddle on the bottom row; a ball moving one cell diagonally per
      step, reflected by the side walls, the ceiling and the bricks (three rows, 1 to 3);
    - action int32 `[B]` of `Discrete(3)`: 0 no-op, 1 left, 2 right (one cell, within the
      board). With probability `sticky_action_prob` (0.1) the previous action is repeated
      instead;
    - reward 1 for each brick broken (a brick hit right after another does not break);
      when the ball reaches the bottom row with no brick left, the three rows come back;
    - the paddle returns the ball: under the ball's column straight up, under the column
      it moves to back the other way; elsewhere the episode terminates;
    - observation bool `[10, 10, 4]` (uint8 in the batch): the paddle, the ball, the
      ball's previous cell (its trail) and the bricks;
    - initial state: the ball in row 3 at the left edge moving down-right or at the right
      edge moving down-left (equally likely), the paddle in column 4, all bricks.

    One difference: MinAtar keeps the previous action across episodes (for a sticky first
    step); here each episode begins with the no-op as the previous action.

    The state is float64 `[B, 38]`: the ball's column and row, its direction (0-3), the
    paddle's column, the ball's previous column and row, whether the last step hit a
    brick, the previous action, then the 30 bricks (row by row, 1 where one stands).

    Args:
      num_envs: int >= 1, the batch size `B`.
      max_episode_steps: int >= 1, the time limit in steps (MinAtar has none; the configs
        set one).
      seed: int, seed of the random generator of the initial states and sticky actions.
      sticky_action_prob: float in [0, 1].

    Raises:
      ValueError: `num_envs` or `max_episode_steps` is not a positive int, or
        `sticky_action_prob` outside [0, 1].
    """

    gymnasium_id = "batchrl.environments.minatar:MinAtar/Breakout-v1"
    state_size = 8 + _BRICKS

    def __init__(self, num_envs, max_episode_steps=10000, seed=0, sticky_action_prob=0.1):
        if not 0.0 <= float(sticky_action_prob) <= 1.0:
            raise ValueError(f"sticky_action_prob must be in [0, 1], got {sticky_action_prob}")
        self._sticky = float(sticky_action_prob)
        super().__init__(
            num_envs, max_episode_steps, seed,
            observation_space=spaces.Box(0, 1, (_SIZE, _SIZE, 4), dtype=bool),
            action_space=spaces.Discrete(3))

    def _initial_state(self, count):
        right = self._random.uniform([count]) < 0.5
        ball_x = tf.where(right, 9.0, 0.0)
        direction = tf.where(right, 3.0, 2.0)
        row = tf.fill([count], 3.0)
        zero = tf.zeros([count], tf.float64)
        columns = [ball_x, row, direction, zero + 4.0, ball_x, row, zero, zero]
        columns = [tf.cast(column, tf.float64) for column in columns]
        return tf.concat([tf.stack(columns, 1), tf.ones([count, _BRICKS], tf.float64)], 1)

    def _transition(self, state, action):
        values = tf.cast(state, tf.int32)
        ball_x, ball_y, direction, paddle, _, _, strike, last = tf.unstack(
            values[:, :8], axis=1)
        bricks = values[:, 8:]
        sticky = self._random.uniform(tf.shape(action)) < self._sticky
        action = tf.where(sticky, last, action)
        paddle = tf.clip_by_value(paddle + tf.gather(_MOVE, action), 0, _SIZE - 1)
        new_x = ball_x + tf.gather(_DX, direction)
        new_y = ball_y + tf.gather(_DY, direction)
        side = (new_x < 0) | (new_x > _SIZE - 1)
        new_x = tf.clip_by_value(new_x, 0, _SIZE - 1)
        direction = tf.where(side, tf.gather(_SIDE, direction), direction)
        top = new_y < 0
        in_rows = (new_y >= _BRICK_ROWS[0]) & (new_y < _BRICK_ROWS[1])
        index = (tf.clip_by_value(new_y, _BRICK_ROWS[0], _BRICK_ROWS[1] - 1)
                 - _BRICK_ROWS[0]) * _SIZE + new_x
        brick = ~top & in_rows & (tf.gather(bricks, index, batch_dims=1) > 0)
        breaks = brick & (strike == 0)
        bottom = ~top & ~brick & (new_y == _SIZE - 1)
        middle = bottom & (ball_x == paddle)
        edge = bottom & ~middle & (new_x == paddle)
        terminated = bottom & ~middle & ~edge
        broken = breaks[:, None] & (tf.one_hot(index, _BRICKS, dtype=tf.int32) > 0)
        bricks = tf.where(broken, 0, bricks)
        refill = bottom & (tf.reduce_sum(bricks, 1) == 0)
        bricks = tf.where(refill[:, None], 1, bricks)
        direction = tf.where(top | breaks | middle, tf.gather(_BOUNCE, direction), direction)
        direction = tf.where(edge, tf.gather(_EDGE, direction), direction)
        new_y = tf.where(top, 0, tf.where(breaks | middle | edge, ball_y, new_y))
        columns = [new_x, new_y, direction, paddle, ball_x, ball_y, tf.cast(brick, tf.int32),
                   action]
        next_state = tf.cast(tf.concat([tf.stack(columns, 1), bricks], 1), tf.float64)
        return next_state, tf.cast(breaks, tf.float64), terminated

    def _observe(self, state):
        values = tf.cast(state, tf.int32)
        cells = _SIZE * _SIZE

        def cell(column, row):
            return tf.one_hot(values[:, row] * _SIZE + values[:, column], cells,
                              dtype=tf.uint8)

        paddle = tf.one_hot((_SIZE - 1) * _SIZE + values[:, _PADDLE], cells, dtype=tf.uint8)
        count = tf.shape(values)[0]
        bricks = tf.concat([
            tf.zeros([count, _BRICK_ROWS[0] * _SIZE], tf.uint8),
            tf.cast(values[:, 8:], tf.uint8),
            tf.zeros([count, cells - _BRICK_ROWS[1] * _SIZE], tf.uint8)], 1)
        channels = tf.stack([paddle, cell(_BALL_X, _BALL_Y), cell(_LAST_X, _LAST_Y), bricks],
                            -1)
        return tf.reshape(channels, [-1, _SIZE, _SIZE, 4])
