"""The in-graph MinAtar Breakout (batchrl.native_tasks:MinAtarBreakout) against the `minatar`
package's game, step by step."""

import numpy as np
import pytest
import tensorflow as tf
from minatar import Environment

from batchrl.native_tasks import MinAtarBreakout

MINIMAL = (0, 1, 3)  # MinAtar's no-op, left and right among its six actions.


def _row(game):
    """The state row of `MinAtarBreakout` for the `minatar` game `game`."""
    return np.concatenate([
        [game.ball_x, game.ball_y, game.ball_dir, game.pos, game.last_x, game.last_y,
         float(game.strike), 0.0], game.brick_map[1:4].reshape(-1)]).astype(np.float64)


def test_follows_minatar_step_by_step():
    """Eight games in parallel, each from MinAtar's own reset, for 600 steps of random
    actions without sticky actions: the same observations, rewards and terminations. The
    steps run in a `tf.function`, as in training."""
    count, rng = 8, np.random.default_rng(0)
    games = [Environment("breakout", sticky_action_prob=0.0) for _ in range(count)]
    env = MinAtarBreakout(count, max_episode_steps=10**6, sticky_action_prob=0.0)
    env.reset()
    simulate = tf.function(env.simulate)
    broken = ended = 0
    for index, game in enumerate(games):
        game.seed(index)
        game.reset()
    env.set_state(tf.range(count), np.stack([_row(game.env) for game in games]))
    for _ in range(600):
        actions = rng.integers(0, 3, count)
        simulate(tf.constant(actions, tf.int32))
        for index, game in enumerate(games):
            reward, terminal = game.act(MINIMAL[actions[index]])
            np.testing.assert_array_equal(env.observ.numpy()[index], game.state())
            assert env.reward.numpy()[index] == reward
            assert env.terminated.numpy()[index] == terminal
            broken += reward
            if terminal:
                ended += 1
                game.reset()
                env.set_state([index], _row(game.env)[None])
    assert broken > 20 and ended > 10  # Bricks broke and games ended along the way.


def test_a_cleared_wall_comes_back_when_the_ball_reaches_the_bottom():
    game = Environment("breakout", sticky_action_prob=0.0)
    game.seed(0)
    game.reset()
    game.env.brick_map[1:4] = 0
    game.env.brick_map[1, 5] = 1  # One brick left.
    env = MinAtarBreakout(1, sticky_action_prob=0.0)
    env.reset()
    env.set_state([0], _row(game.env)[None])
    for step in range(200):  # The paddle follows the ball: no game ends.
        ball = int(env.state.numpy()[0, 0])
        paddle = int(env.state.numpy()[0, 3])
        action = 0 if ball == paddle else (1 if ball < paddle else 2)
        env.simulate(tf.constant([action], tf.int32))
        game.act(MINIMAL[action])
        np.testing.assert_array_equal(env.observ.numpy()[0], game.state(), err_msg=step)
    assert env.observ.numpy()[0, 1:4, :, 3].sum() > 1  # The bricks came back.


@pytest.mark.parametrize("sticky", [0.0, 1.0])
def test_sticky_actions_repeat_the_previous_action(sticky):
    env = MinAtarBreakout(4, sticky_action_prob=sticky, seed=3)
    env.reset()
    for _ in range(3):
        env.simulate(tf.fill([4], 2))  # Right.
    paddle = env.state.numpy()[:, 3]
    # Always sticky: the first previous action (no-op) repeats forever.
    np.testing.assert_array_equal(paddle, 4 if sticky else 7)


def test_resets_draw_both_starts_and_the_observation_is_bytes():
    env = MinAtarBreakout(64, seed=1)
    observ = env.reset().numpy()
    assert observ.dtype == np.uint8 and observ.shape == (64, 10, 10, 4)
    ball = observ[:, :, :, 1].reshape(64, -1).argmax(1)
    assert set(np.unique(ball)) == {30, 39}  # Row 3, the left or the right edge.
    assert (observ[:, 9, 4, 0] == 1).all() and observ[:, 1:4, :, 3].all()
