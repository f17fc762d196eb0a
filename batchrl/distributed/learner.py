"""The learner of an actor-learner run: the training `Loop` whose train phases learn from the
actors' fragments (`pool.ActorPool`) instead of stepping environments, and whose eval
phases and checkpoints are the Loop's own."""

import time

import numpy as np
import tensorflow as tf

from batchrl.distributed import fragment as fragment_lib
from batchrl.drivers.loop import EnvironmentFailed, Loop
from batchrl.environments.wrappers import WorkerError


class LearnerFailed(EnvironmentFailed):
    """With learners that share the update: another learner died or hung, and this one's
    all-reduce failed (the run ends; its latest checkpoint is as it was)."""


class ActorLearnerLoop(Loop):
    """A `Loop` whose train phase takes the actors' fragments one at a time and makes one
    update (`IMPALA.learn`) on each, until `eval_every` environment steps of fragments
    were learned from; the eval phases step the learner's own batch (`batch_env`) with the
    mean action, as in every run.

    Policy versions count the learner's updates (`version`, kept in the checkpoint); the
    actors get the learner's weights (`Actor.get_weights`: the policy and the observation
    filter) at the start of each train phase, every `broadcast_every` updates, and after
    each fragment learned from without an update since the last publication (an Ape-X
    learner before `learning_starts`: the global step and the observation statistics move
    on, and the actors' exploration schedules follow the step). A
    fragment's policy lag is the learner's version minus the version that acted on it;
    a fragment with a lag above `max_policy_lag` (None: no bound) is dropped and counted,
    its steps not learned from nor counted in the global step, and the learner publishes
    its weights then if it has not published its current version yet: so the actors soon
    act with weights young enough, whatever `broadcast_every`, and no setting can stall
    the learner.

    At every `log_every` steps and at a phase's end, besides `mean_score` and
    `mean_length` of the actors' finished episodes and the update's summaries, the train
    writer receives under `actors/`: `policy_lag_min`, `policy_lag_mean`,
    `policy_lag_max` (of the fragments learned from since the last write),
    `dropped_fragments` and `discarded_fragments` (so far in this process: too old, and
    lost with a failed actor), `restarts` (of all actors), `queue_depth` (the mean number
    of fragments ready and waiting when the learner took one), `updates_per_second` and
    `steps_per_second` (learned steps over the wall-clock time since the last write), and
    `actor_steps_per_second` (one actor's steps over its recording time, mean).

    Args:
      logdir, batch_env, algo, step, is_training, should_log, checkpoint: as for `Loop`;
        `algo` has `learn(fragment, log)` and `actor` (e.g. `IMPALA`).
      pool: the `pool.ActorPool` (closed by the caller).
      broadcast_every: int >= 1.
      max_policy_lag: int >= 0 or None.
      learners: the other learners that share the update (`learners.RemoteLearner` Ray
        actors; their `join` done): each train phase makes as many updates on each, in
        lock-step, and every update counts one fragment of each in the global step.
      fragment_steps: int, the steps of one fragment (`envs_per_actor * rollout_length`),
        with `learners`.
      **options: the other arguments of `Loop` (`steps`, `eval_every`, ...).
    """

    def __init__(self, logdir, batch_env, algo, step, is_training, should_log, checkpoint,
                 pool, broadcast_every=1, max_policy_lag=None, learners=(), fragment_steps=0,
                 **options):
        self._version = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="policy_version")
        checkpoint.policy_version = self._version
        super().__init__(logdir, batch_env, algo, step, is_training, should_log, checkpoint,
                         **options)
        self._pool = pool
        self._broadcast_every = int(broadcast_every)
        self._max_policy_lag = max_policy_lag
        self.dropped = 0  # Fragments too old to learn from, in this process.
        self._published = None  # The version last published.
        self._learners = list(learners)  # The other learners (`learners.RemoteLearner`).
        self._fragment_steps = int(fragment_steps)  # Steps of one fragment (theirs too).

    @property
    def version(self):
        """The learner's policy version (int): its updates so far."""
        return int(self._version.numpy())

    def trace_learn(self, rows):
        """Traces the algorithm's `learn` for fragments of `rows` rows (its `trace_learn`,
        if it has one) before the first arrives, under the train writer as `_train_phase`
        calls it: a function traced with no default writer writes no summary, whatever
        writer its later calls run under."""
        trace = getattr(self._algo, "trace_learn", None)
        if trace is not None:
            with self._writers["train"].as_default(step=self._step):
                trace(rows)

    def _stepped(self, algo):
        """The learner's step function only evaluates: it acts with `algo` and records
        nothing (`ActingOnly`), so it holds no update and traces in less time."""
        return ActingOnly(algo)

    def _compile_ahead(self):
        """Nothing: the learner's updates come through `learn` (traced by `trace_learn`);
        its step function holds none (`ActingOnly`)."""

    def _publish(self):
        self._pool.publish(self.version, self._weights())
        self._published = self.version

    def _weights(self):
        """The arrays the actors act with (`Actor.get_weights`)."""
        return self._algo.actor.get_weights()

    def _train_phase(self, bar):
        self._is_training.assign(True)
        self._should_log.assign(True)
        step = int(self._step.numpy())
        end = min(self._steps, (step // self._eval_every + 1) * self._eval_every)
        next_log = (step // self._log_every + 1) * self._log_every
        scores, lengths = [], []
        window = _Window(step, 0)
        start_step, start_time, dropped = step, time.time(), self.dropped
        self._publish()
        version = self.version
        writer = self._writers["train"]
        shares, others = 1 + len(self._learners), self._shared_phase(step, end)
        while step < end:
            self._check_stop()
            try:
                taken = self._pool.next()
            except WorkerError as error:  # An actor failed past its restarts.
                raise EnvironmentFailed(f"at step {step:,}: {error}") from error
            lag = version - taken.version
            if self._max_policy_lag is not None and lag > self._max_policy_lag:
                self.dropped += 1
                if self._published != version:
                    self._publish()
                continue
            # With M learners an update learns from one fragment of each (as large).
            after = step + shares * int(np.sum(taken.fragment["length"]))
            log = after >= next_log or after >= end
            while next_log <= after:
                next_log += self._log_every
            self._step.assign(after)
            with writer.as_default(step=self._step):  # A variable: read at every call.
                updates = self._learn(taken, log)
            previous, version = version, version + updates
            self._version.assign(version)
            if (version // self._broadcast_every > previous // self._broadcast_every
                    or version == self._published):
                self._publish()  # Also the step and statistics of a learner not updating yet.
            scores.extend(taken.scores)
            lengths.extend(taken.lengths)
            window.add(taken, lag, updates)
            if log:
                self._write_window(window, after, scores, lengths)
                window = _Window(after, len(scores))
            bar.update(after - step)
            step = after
        if others:
            import ray

            ray.get(others)  # Their phase's updates, made with this one's.
        result = self._train_result(step, start_step, start_time, scores, lengths)
        if not scores:
            agents = self._pool.agents
            result.no_episode = (
                f"the actors' fragments learned from held {result.steps:,} steps of their "
                f"{agents} environments, {result.steps // agents:,} each, and no episode's "
                f"end; episodes run on across phases")
            if self.dropped > dropped:
                result.no_episode += f"; {self.dropped - dropped:,} fragments dropped for lag"
        return result

    def _shared_phase(self, step, end):
        """With other learners: starts their train phases of as many updates as this one's
        from `step` to `end` (each update learns from one fragment of every learner, of
        `envs_per_actor * rollout_length` steps); returns the calls to wait for."""
        if not self._learners:
            return []
        per_update = (1 + len(self._learners)) * self._fragment_steps
        updates = -(-(end - step) // per_update)
        return [learner.train.remote(updates, self._broadcast_every)
                for learner in self._learners]

    def _learn(self, taken, log):
        """Learns from `taken` (a `pool.Fragment`) with summaries while `log`, through the
        algorithm's one way in (`Algorithm.learn`); returns the updates made (int).

        Raises:
          LearnerFailed: with other learners, their all-reduce failed (one of them died or
            did not answer within `worker_timeout`).
        """
        try:
            return self._algo.learn(self._recording(taken.fragment), log=log)["updates"]
        except tf.errors.OpError as error:
            if not self._learners:
                raise
            lines = [line for line in str(error.message).splitlines() if line.strip()]
            cause = next((line for line in lines if "Collective" in line), lines[-1])
            raise LearnerFailed(
                f"at step {int(self._step.numpy()):,}: another learner died or did not "
                f"answer (the learners' all-reduce: {cause}); the latest checkpoint is "
                f"kept: run the same command to resume") from error

    def _recording(self, sent):
        """The recording as the actor's recorder made it, from the form it travelled in
        (a fragment: `fragment.expand`)."""
        return fragment_lib.expand(sent)

    def _write_window(self, window, step, scores, lengths):
        """The `actors/` summaries of the fragments since the last write, and the scores
        of the episodes that ended since then."""
        seconds = max(time.time() - window.started, 1e-9)
        if len(scores) > window.scores:
            self._write_scores("train", step, scores[window.scores:], lengths[window.scores:])
        with self._writers["train"].as_default(step=step):
            if window.lags:
                tf.summary.scalar("actors/policy_lag_min", min(window.lags))
                tf.summary.scalar("actors/policy_lag_mean", np.mean(window.lags))
                tf.summary.scalar("actors/policy_lag_max", max(window.lags))
                tf.summary.scalar("actors/queue_depth", np.mean(window.queued))
                tf.summary.scalar("actors/actor_steps_per_second",
                                  np.mean(window.actor_rates))
            tf.summary.scalar("actors/updates_per_second", window.updates / seconds)
            tf.summary.scalar("actors/steps_per_second", (step - window.step) / seconds)
            tf.summary.scalar("actors/dropped_fragments", self.dropped)
            tf.summary.scalar("actors/discarded_fragments", self._pool.discarded)
            tf.summary.scalar("actors/restarts", sum(self._pool.restarts))


class ActingOnly:
    """An algorithm as an actor-learner run's learner steps its own environments: only in
    its eval phases, so only acting. `begin_episodes` and `perform` are the algorithm's;
    `experience` and `end_episodes` record nothing and return False, so that `simulate`
    traced with it holds neither the recording nor the in-process update (which the
    learner never runs: it learns through `Algorithm.learn`)."""

    def __init__(self, algo):
        self._algo = algo

    def begin_episodes(self, agent_indices):
        return self._algo.begin_episodes(agent_indices)

    def perform(self, agent_indices, observ):
        return self._algo.perform(agent_indices, observ)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        return tf.constant(False)

    def end_episodes(self, agent_indices):
        return tf.constant(False)


class _Window:
    """What the fragments learned from since the last summaries held."""

    def __init__(self, step, scores):
        self.step = step  # The global step at the window's start.
        self.scores = scores  # The phase's episodes that ended before it.
        self.started = time.time()
        self.lags, self.queued, self.actor_rates = [], [], []
        self.updates = 0

    def add(self, taken, lag, updates):
        self.updates += updates
        self.lags.append(lag)
        self.queued.append(taken.queued)
        self.actor_rates.append(np.sum(taken.fragment["length"]) / max(taken.seconds, 1e-9))
