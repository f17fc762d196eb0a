"""One step of every agent of a batch, fused with the algorithm into one graph operation
(or, for a loop that the application drives, two: `act` and `observe`)."""

import weakref

import tensorflow as tf

from batchrl.tools.graph import after
from batchrl.tools.streaming import StreamingMean

# Running score and length of each agent's current episode, and the statistics of the
# episodes that ended since the last summary, per in-graph batch environment.
_EPISODE_STATE = weakref.WeakKeyDictionary()


class _EpisodeState(tf.Module):

    def __init__(self, batch):
        super().__init__(name="simulate")
        with self.name_scope:
            self.score = tf.Variable(tf.zeros([batch], tf.float32), trainable=False,
                                     name="score")
            self.length = tf.Variable(tf.zeros([batch], tf.int32), trainable=False,
                                      name="length")
        self.mean_score = StreamingMean((), tf.float32, name="mean_score")
        self.mean_length = StreamingMean((), tf.float32, name="mean_length")


def episode_state(batch_env):
    """The variables `simulate` keeps for `batch_env`, created on the first use.

    Holds `score` (float32 `[batch]`) and `length` (int32 `[batch]`) of each agent's
    current episode and the `StreamingMean`s `mean_score` and `mean_length` of the episodes
    that ended since the last summary. Calling this once before the first trace of a
    `tf.function` that calls `simulate` avoids the extra trace TensorFlow makes when a
    function creates variables.
    """
    if batch_env not in _EPISODE_STATE:
        with tf.init_scope():  # Create the variables once, outside of any trace.
            _EPISODE_STATE[batch_env] = _EpisodeState(len(batch_env))
    return _EPISODE_STATE[batch_env]


def _indices(mask):
    """int32 `[n]`, the indices of the True entries of the bool vector `mask`."""
    return tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)


def _write_summaries(state, log, ready):
    """When `log` is true and episodes were recorded, writes the `mean_score` and
    `mean_length` of the recorded episodes (after `ready`) and starts a new average."""

    def write():
        with tf.name_scope("/"):  # Plain tags, whatever scope this runs in.
            score_written = tf.summary.scalar("mean_score", state.mean_score.clear())
            length_written = tf.summary.scalar("mean_length", state.mean_length.clear())
        return tf.logical_and(score_written, length_written)

    with tf.control_dependencies([ready]):
        return tf.cond(tf.logical_and(log, state.mean_score.count > 0), write,
                       lambda: tf.constant(False))


def _begin_all(batch_env, state, reset):
    """When `reset` is true, prepares new episodes for all agents: forgets the episodes
    recorded but not yet written to a summary and sets every agent's `done` flag, so that
    the next step begins an episode for each. Returns a bool tensor to wait for."""

    def prepare():
        forgot = [state.mean_score.clear(), state.mean_length.clear()]
        marked = batch_env.done.assign(tf.ones([len(batch_env)], tf.bool))
        return after(forgot + [marked], True)

    return tf.cond(reset, prepare, lambda: tf.constant(False))


def simulate(batch_env, algo, log, reset):
    """Steps every agent of the batch once; must be called inside a `tf.function`.

    One call:

    1. begins new episodes for the agents whose `done` flag is set (all agents on the very
       first call, because `batch_env.done` starts True, and all agents when `reset` is
       true): resets their environments, zeroes their score and length and calls
       `algo.begin_episodes(indices)`; when `reset` is true, episodes recorded but not yet
       written to a summary are forgotten too (they belong to what came before);
    2. computes `action = algo.perform(all_indices, observ)` and steps all environments;
    3. adds the reward to the scores and calls
       `algo.experience(all_indices, observ, action, reward, done, nextob)`, where `nextob`
       is the observation after the step (the final one when the episode ended);
    4. calls `algo.end_episodes(indices)` for the agents whose episode ended at this step
       and records their score and length; where `batch_env.interrupted` is not None,
       agents whose episode the batch cut short (it restarted their environment's worker)
       are left out of steps 3 and 4: their `done` is True, their score NaN, and their
       episode counts nowhere;
    5. when `log` is true and episodes were recorded since the last summary, writes their
       means as the scalars `mean_score` and `mean_length` to the default summary writer
       and starts a new average.

    Every environment call depends explicitly on the calls that must precede it: the step
    on the reset, the algorithm's `experience` on the step, and so on.

    Args:
      batch_env: an `InGraphBatchEnv`.
      algo: an algorithm with `begin_episodes`, `perform`, `experience`, `end_episodes`;
        each may return tensors or operations that the next phase then waits for.
      log: bool scalar tensor, write the `mean_score` / `mean_length` summaries; the
        Python value False builds no summary ops at all (as XLA needs).
      reset: bool scalar tensor, begin new episodes for all agents (by setting their
        `done` flags first); the Python value False builds no ops for it.

    Returns:
      `(done, score)`: bool `[batch]`, the episode ended at this step; float32 `[batch]`,
      the undiscounted return of each agent's current episode so far (NaN for an episode
      cut short, see step 4).
    """
    state = episode_state(batch_env)
    if log is not False:
        log = tf.convert_to_tensor(log, tf.bool)
    prepared = []
    if reset is not False:
        prepared.append(_begin_all(batch_env, state, tf.convert_to_tensor(reset, tf.bool)))
    began = _begin_flagged(batch_env, algo, state, prepared, reset_envs=True)
    with tf.control_dependencies([began]):
        observ = tf.identity(batch_env.observ)
        action = algo.perform(tf.range(len(batch_env)), observ)
        done = batch_env.simulate(action)
    with tf.control_dependencies([done]):
        nextob = tf.identity(batch_env.observ)
    return _finish_step(batch_env, algo, state, observ, action, done, nextob, log)


def act(batch_env, algo, observ):
    """Steps 1 and 2 of `simulate` for a loop that the application drives; call inside a
    `tf.function`.

    Begins new episodes for the agents whose `done` flag is set (all agents at the first
    call, and those whose episode ended at the last `observe`): zeroes their score and
    length and calls `algo.begin_episodes(indices)`; the application has reset their
    environments itself, and `observ` holds their first observations. Then stores `observ`
    and asks `algo.perform` for the actions of all agents.

    Args:
      batch_env: an `ApplicationBatchEnv`.
      algo: as for `simulate`.
      observ: float32 `[batch, *observation_shape]`, the current observation of each agent.

    Returns:
      The actions `[batch, *action_shape]`, also stored in `batch_env.action`.
    """
    state = episode_state(batch_env)
    stored = batch_env.observ.assign(observ)
    began = _begin_flagged(batch_env, algo, state, [stored], reset_envs=False)
    with tf.control_dependencies([began]):
        observ = tf.identity(batch_env.observ)
        action = algo.perform(tf.range(len(batch_env)), observ)
    return after([batch_env.action.assign(action)], action)


def observe(batch_env, algo, reward, terminated, truncated, nextob, log):
    """Steps 3 to 5 of `simulate` for a loop that the application drives, after `act`;
    call inside a `tf.function`.

    Args:
      batch_env: the `ApplicationBatchEnv` that `act` was given.
      algo: as for `simulate`.
      reward: float32 `[batch]`, the reward of the step the application took.
      terminated: bool `[batch]`, the step ended the episode in a terminal state.
      truncated: bool `[batch]`, the step ended the episode for another reason (a time
        limit): the value is bootstrapped from `nextob`.
      nextob: float32 `[batch, *observation_shape]`, the observation after the step (the
        final observation for agents whose episode ended).
      log: as for `simulate`.

    Returns:
      `(done, score)` as `simulate` returns them.
    """
    state = episode_state(batch_env)
    if log is not False:
        log = tf.convert_to_tensor(log, tf.bool)
    done = tf.logical_or(terminated, truncated)
    assigns = [batch_env.reward.assign(reward), batch_env.terminated.assign(terminated),
               batch_env.done.assign(done)]
    with tf.control_dependencies(assigns):
        done = tf.identity(done)
    return _finish_step(batch_env, algo, state, tf.identity(batch_env.observ),
                        tf.identity(batch_env.action), done, nextob, log)


def _begin_flagged(batch_env, algo, state, prepared, reset_envs):
    """Step 1 of `simulate` after `prepared`: begins episodes for the agents whose `done`
    flag is set, resetting their environments when `reset_envs` (else clearing the flags).
    The indices are computed only in the branch that needs them: most steps begin no
    episode. Returns a bool tensor to wait for."""

    def begin_episodes():
        begin_indices = _indices(batch_env.done)
        rows = begin_indices[:, None]
        if reset_envs:
            ready = batch_env.reset(begin_indices)
        else:
            ready = batch_env.done.scatter_nd_update(
                rows, tf.zeros_like(begin_indices, tf.bool))
        with tf.control_dependencies([ready]):
            zeros = tf.zeros_like(begin_indices)
            clear_score = state.score.scatter_nd_update(rows, tf.cast(zeros, tf.float32))
            clear_length = state.length.scatter_nd_update(rows, zeros)
            began = algo.begin_episodes(begin_indices)
        return after([clear_score, clear_length, began], True)

    with tf.control_dependencies(prepared):
        any_begin = tf.reduce_any(batch_env.done)
    return tf.cond(any_begin, begin_episodes, lambda: tf.constant(False))


def _finish_step(batch_env, algo, state, observ, action, done, nextob, log):
    """Steps 3 to 5 of `simulate`, once `done` (the stepped batch's flags) is available;
    returns `(done, score)`.

    Where the batch environment tracks `interrupted` (episodes it cut short by restarting a
    worker), those agents are left out of `experience` and `end_episodes` and their episodes
    are not recorded; they are `done`, so the next step begins new episodes for them, and
    their score is NaN."""
    all_indices = tf.range(len(batch_env))
    interrupted = getattr(batch_env, "interrupted", None)
    with tf.control_dependencies([done, nextob]):
        reward = tf.identity(batch_env.reward)
        add_score = state.score.assign_add(reward)
        add_length = state.length.assign_add(tf.ones_like(all_indices))
        if interrupted is None:
            ended_mask = done
            experienced = algo.experience(all_indices, observ, action, reward, done, nextob)
        else:
            cut = tf.identity(interrupted)
            ended_mask = tf.logical_and(done, tf.logical_not(cut))

            def experience(indices):
                values = [tf.gather(x, indices) for x in (observ, action, reward, done, nextob)]
                return after(algo.experience(indices, *values), True)

            experienced = tf.cond(
                tf.reduce_any(cut), lambda: experience(_indices(tf.logical_not(cut))),
                lambda: after(algo.experience(
                    all_indices, observ, action, reward, done, nextob), True))

    def end_episodes():
        end_indices = _indices(ended_mask)
        recorded = [
            state.mean_score.submit(tf.gather(state.score, end_indices)),
            state.mean_length.submit(
                tf.cast(tf.gather(state.length, end_indices), tf.float32)),
        ]
        ended = algo.end_episodes(end_indices)
        return after([recorded, ended], True)

    any_end = after([add_score, add_length, experienced],
                    tf.reduce_any(ended_mask))
    ended = tf.cond(any_end, end_episodes, lambda: tf.constant(False))

    logged = ended if log is False else _write_summaries(state, log, ended)
    with tf.control_dependencies([logged]):
        score = tf.identity(state.score)
        if interrupted is not None:
            score = tf.where(cut, tf.constant(float("nan")), score)
        return tf.identity(done), score


def simulate_steps(batch_env, algo, steps, log, reset, count=None):
    """Up to `steps` calls of `simulate` in one `tf.while_loop`; call inside a `tf.function`.

    Running several steps per `tf.function` call saves the call's overhead on every step but
    the first (measured in docs/configuration.md, `steps_per_call`).

    Args:
      batch_env, algo: as for `simulate`.
      steps: Python int >= 1, the number of steps of a full call (the static size of the
        results).
      log: bool scalar tensor (or the Python value False), write the summaries as
        `simulate` does, once after the last step: they cover every episode that ended
        during the call (and before it, since the last summary).
      reset: bool scalar tensor, begin new episodes for all agents at the first step (as
        `simulate` does; prepared once, before the loop, so the steps build no ops for it).
      count: optional int32 scalar tensor in `[0, steps]`, the steps to run (default
        `steps`), so that one traced function can also run a shorter, final call; 0 runs
        none (with `reset` and `log` false, such a call changes nothing).

    Returns:
      `(done, score)`: bool `[steps, batch]` and float32 `[steps, batch]`, row `i` what
      `simulate` returned at the `i`-th step; rows from `count` on are False and 0.
    """
    steps = int(steps)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    batch = len(batch_env)
    state = episode_state(batch_env)
    count = tf.constant(steps) if count is None else tf.convert_to_tensor(count, tf.int32)
    if log is not False:
        log = tf.convert_to_tensor(log, tf.bool)
    prepared = _begin_all(batch_env, state, tf.convert_to_tensor(reset, tf.bool))

    def body(index, dones, scores):
        done, score = simulate(batch_env, algo, False, False)
        return index + 1, dones.write(index, done), scores.write(index, score)

    with tf.control_dependencies([prepared]):
        first = tf.identity(0)
    _, dones, scores = tf.while_loop(
        lambda index, *_: index < count,
        body,
        # A tuple, as `body` returns: run eagerly, `tf.while_loop` compares them strictly.
        (first, tf.TensorArray(tf.bool, steps, element_shape=[batch]),
         tf.TensorArray(tf.float32, steps, element_shape=[batch])),
        maximum_iterations=steps)
    # Rows never written (count < steps) read as zeros.
    dones, scores = dones.stack(), scores.stack()
    if log is False:
        return dones, scores
    logged = _write_summaries(state, log, dones)
    with tf.control_dependencies([logged]):
        return tf.identity(dones), tf.identity(scores)
