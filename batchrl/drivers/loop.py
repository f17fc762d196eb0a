"""The training loop: alternating train and eval phases, their summaries, and the compiled
step function that each call of it runs."""

import contextlib
import os
import sys
import time

import numpy as np
import tensorflow as tf
import tqdm

from batchrl.drivers.checkpoints import Checkpoints
from batchrl.drivers.progress import PhaseResult, bar_postfix, report_line
from batchrl.drivers.simulate import episode_state, simulate_steps
from batchrl.tools.graph import TracedCall


class Interrupted(Exception):
    """Training stopped between two steps because a stop was requested."""


class EnvironmentFailed(RuntimeError):
    """An environment raised inside a step (e.g. a crashed worker, a NaN observation); the
    message is the environment's error, which is also the `__cause__`."""


class Loop:
    """Runs training as alternating phases until `steps` training steps are done.

    - `train`: `is_training` and `should_log` are true (sampled actions, learning on) for
      `eval_every` environment steps (`steps` counts every agent's step); the global `step`
      variable counts these steps. `mean_score` / `mean_length` of the episodes that
      ended are written every `log_every` steps and at the end of the phase to
      `LOGDIR/train` (nothing where none ended: a phase of fewer steps per agent than an
      episode has scores none, as its printed line says), and at its end, at
      the global step, `time/train_steps_per_second` (the phase's training steps over its
      wall-clock seconds, updates included: `PhaseResult.steps_per_second`) and
      `time/train_phase_seconds` (those seconds), from which `batchrl-benchmark` averages
      a run's speed over phases and resumed processes. Then a checkpoint.
    - `eval`: `is_training` and `should_log` are false (mean actions, no learning). In
      rounds, every agent starts an episode and the first episode that each of the agents
      a round still needs finishes is counted, the lowest-numbered agents first, until
      `eval_episodes` episodes are counted (a batch of 128 with `eval_episodes` 8 counts
      agents 0-7 and ends its round when those 8 have finished: which agents count does
      not depend on how long their episodes are, so short episodes are not favoured, and a
      long game on agent 100 does not lengthen the round); their `mean_score` /
      `mean_length` go to `LOGDIR/eval` at the current global step, with
      `time/training_seconds`, the wall-clock seconds from the start of this `run` call to
      the end of this evaluation (tracing, updates, evaluations and checkpoints included;
      a resumed run counts from 0 again), to read how fast a run learned in time as well
      as in steps. (The Loop writes these
      itself: `simulate`'s own summaries would include the later episodes of agents that
      finished early, biasing the mean towards short episodes.) Eval steps are not counted
      in the global step.

    Each phase starts new episodes for all agents. Both phases call one `tf.function`
    (`step_function`: `steps_per_call` batch steps per call), traced once: the variables
    `is_training` and `should_log` tell the phases apart inside it, so the graph is built
    and optimized once, not once per phase. The first `run` begins with a call of 0 steps
    that does only that (`tracing_seconds`, also written with every eval as
    `time/tracing_seconds`); `tracing_count()` reports the traces. Given `started_at`,
    the seconds from it to that first call (`startup_seconds`: the process's imports,
    the environments and the networks) are written with every eval as
    `time/startup_seconds`. The global step is advanced after each train call.

    Checkpoints (`tf.train.CheckpointManager` in `LOGDIR`, the last `keep_checkpoints`)
    are written after every train phase; `run()` resumes from the latest one. A `replay`
    (the replay memory of `save_replay: true`) is kept once per run directory beside the
    latest checkpoint, not in every checkpoint (`checkpoints.Checkpoints`).

    Args:
      logdir: run directory (created if missing).
      batch_env: `InGraphBatchEnv`.
      algo: the algorithm, already constructed with `step`, `is_training`, `should_log`.
      step: int64 variable, the number of training environment steps done.
      is_training, should_log: bool variables shared with the algorithm.
      checkpoint: `tf.train.Checkpoint` holding `step` and the algorithm's state.
      steps: training environment steps to reach.
      eval_every: training environment steps per train phase.
      eval_episodes: episodes per eval phase (0 for no evaluation).
      log_every: environment steps between train summaries.
      keep_checkpoints: number of checkpoints kept.
      progress: show a progress bar (None: only when the output is a terminal).
      stop: optional `threading.Event`; once set, `run` raises `Interrupted` after the
        current call (so a signal handler can stop training at a consistent point).
      steps_per_call: batch steps per call of a step function (`simulate_steps`); a train
        phase's last call runs only the steps left, so phases end where they would with 1.
        Summaries are then written at the end of the call that crosses a `log_every`
        boundary, and an eval round may run up to `steps_per_call - 1` steps beyond the
        end of its last episode.
      started_at: optional epoch seconds at which the process (or command) started, for
        `startup_seconds`.
      replay: optional trackable (the algorithm's replay memory) saved once per run
        directory with the latest checkpoint, as above.
      jit_compile: compile the step function with XLA (`step_function`): the environment
        must be in-graph (`batchrl.native_tasks`), nothing inside the call writes summaries (the
        algorithm's update summaries are left out) and the Loop writes the train phase's
        `mean_score` / `mean_length` itself, at the step where the call that crosses a
        `log_every` boundary began.

    Raises:
      ValueError: for non-positive `steps`, `eval_every`, `log_every` or `steps_per_call`.
    """

    def __init__(self, logdir, batch_env, algo, step, is_training, should_log, checkpoint,
                 steps, eval_every, eval_episodes, log_every, keep_checkpoints=5,
                 progress=None, stop=None, steps_per_call=1, jit_compile=False,
                 started_at=None, replay=None):
        for name, value in (("steps", steps), ("eval_every", eval_every),
                            ("log_every", log_every), ("steps_per_call", steps_per_call)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self._logdir = os.fspath(logdir)
        self._batch_env = batch_env
        self._algo = algo
        self._step = step
        self._is_training = is_training
        self._should_log = should_log
        self._steps = int(steps)
        self._eval_every = int(eval_every)
        self._eval_episodes = int(eval_episodes)
        self._log_every = int(log_every)
        self._progress = progress
        self._stop = stop
        self._restored = False
        self._checkpoints = Checkpoints(self._logdir, checkpoint, keep_checkpoints, replay)
        self._writers = {
            name: tf.summary.create_file_writer(os.path.join(self._logdir, name))
            for name in ("train", "eval")}
        self._steps_per_call = int(steps_per_call)
        # The eval phase writes its summaries itself (log is false in its calls), so the
        # train writer is the function's default writer in both phases.
        self._jit_compile = bool(jit_compile)
        self._function = TracedCall(step_function(
            batch_env, self._stepped(algo), self._steps_per_call,
            None if jit_compile else self._writers["train"], step, count_steps=False,
            jit_compile=jit_compile))
        self._started_at = started_at
        self._startup_seconds = None
        self._tracing_seconds = None

    def _stepped(self, algo):
        """What the step function runs `simulate` with: the algorithm."""
        return algo

    @property
    def manager(self):
        """The `tf.train.CheckpointManager` of `logdir`."""
        return self._checkpoints.manager

    def tracing_count(self):
        """How often the step function of both phases was traced (int)."""
        return self._function.experimental_get_tracing_count()

    @property
    def tracing_seconds(self):
        """Wall-clock seconds that tracing and optimizing the step function took at the
        start of the first `run` (float; None before it)."""
        return self._tracing_seconds

    @property
    def startup_seconds(self):
        """Wall-clock seconds from `started_at` to the start of the first `run`'s tracing
        (float; None before it or without `started_at`)."""
        return self._startup_seconds

    @property
    def replay_restored(self):
        """Where `restore` read the `replay` from (str: a checkpoint prefix), or None when
        it restored none (`checkpoints.Checkpoints.replay_restored`)."""
        return self._checkpoints.replay_restored

    def restore(self):
        """Restores the latest checkpoint if there is one, and the `replay` saved with it
        (`checkpoints.Checkpoints`); returns the checkpoint's path or None."""
        self._restored = True
        return self._checkpoints.restore()

    def save(self):
        """Writes a checkpoint at the current global step, and the `replay` beside it
        (`checkpoints.Checkpoints`); returns the checkpoint's path.

        Raises:
          FloatingPointError: a variable holds NaN or infinite values; nothing is written,
            so the last good checkpoint stays the latest.
        """
        path = self._checkpoints.save(int(self._step.numpy()))
        for writer in self._writers.values():
            writer.flush()
        return path

    def run(self, on_phase=None, on_ready=None):
        """Trains until `steps`, resuming from the latest checkpoint (unless `restore` was
        called already).

        Args:
          on_phase: optional callable receiving each `PhaseResult` as it ends.
          on_ready: optional callable, called without arguments once the step function
            is traced, before the first training step (`startup_seconds` and
            `tracing_seconds` are set then).

        Returns:
          list of `PhaseResult`s of this call.

        Raises:
          Interrupted: the `stop` event was set; the step counter holds the steps done.
          EnvironmentFailed: an environment raised; the latest checkpoint is untouched.
          FloatingPointError: a checkpoint would have held non-finite values.
        """
        if not self._restored:
            self.restore()
        results = []
        started = time.time()
        if self._tracing_seconds is None:
            if self._started_at is not None:
                self._startup_seconds = started - self._started_at
            # A call of 0 steps traces and optimizes the graph and changes nothing; an
            # update compiled with XLA is compiled now, not in the first train phase.
            self._call(False, False, 0)
            self._compile_ahead()
            self._tracing_seconds = time.time() - started
            if on_ready is not None:
                on_ready()
        start = int(self._step.numpy())
        bar = tqdm.tqdm(total=self._steps, initial=min(start, self._steps), unit="step",
                        unit_scale=True, dynamic_ncols=True, mininterval=1.0,
                        disable=None if self._progress is None else not self._progress)
        try:
            while int(self._step.numpy()) < self._steps:
                train = self._train_phase(bar)
                self.save()
                phases = [train]
                if self._eval_episodes > 0:
                    phases.append(self._eval_phase(started))
                for result in phases:
                    results.append(result)
                    if on_phase:
                        on_phase(result)
                bar.set_postfix_str(bar_postfix(phases), refresh=False)
                bar.write(report_line(phases, len(self._batch_env)))
                sys.stdout.flush()  # Progress reaches log files now, not at exit.
        finally:
            bar.close()
            for writer in self._writers.values():
                writer.flush()
        return results

    def _train_phase(self, bar):
        self._is_training.assign(True)
        self._should_log.assign(True)
        batch = len(self._batch_env)
        step = int(self._step.numpy())
        end = min(self._steps, (step // self._eval_every + 1) * self._eval_every)
        next_log = (step // self._log_every + 1) * self._log_every
        scores, lengths, running = [], [], np.zeros(batch, np.int64)
        start_step, start_time = step, time.time()
        reset, logged = True, 0
        while step < end:
            self._check_stop()
            count = min(self._steps_per_call, -(-(end - step) // batch))
            after = step + count * batch
            last = after >= end
            log = last or after >= next_log
            while next_log <= after:
                next_log += self._log_every
            done, score = self._call(log, reset, count)
            self._step.assign_add(count * batch)
            reset = False
            for row in range(count):
                self._collect(done[row], score[row], running, scores, lengths)
            if log and self._jit_compile and len(scores) > logged:
                self._write_scores("train", step, scores[logged:], lengths[logged:])
                logged = len(scores)
            step = after
            bar.update(count * batch)
        return self._train_result(step, start_step, start_time, scores, lengths)

    def _train_result(self, step, start_step, start_time, scores, lengths):
        """The `PhaseResult` of a train phase from `start_step` (begun at `start_time`,
        `time.time()`) to `step`, whose speed (`time/train_steps_per_second`,
        `time/train_phase_seconds`) it writes to the train writer at `step`."""
        result = PhaseResult("train", step, step - start_step, time.time() - start_time,
                             scores, lengths)
        with self._writers["train"].as_default(step=step):
            tf.summary.scalar("time/train_steps_per_second", result.steps_per_second)
            tf.summary.scalar("time/train_phase_seconds", result.seconds)
        return result

    def _write_scores(self, name, step, scores, lengths, **scalars):
        """Writes `mean_score`, `mean_length` and `scalars` (tag -> value) to the `name`
        writer at `step`: the eval summaries, and under `jit_compile` the train summaries
        that `simulate` writes inside an uncompiled call."""
        with self._writers[name].as_default(step=step):
            tf.summary.scalar("mean_score", np.mean(scores))
            tf.summary.scalar("mean_length", np.mean(lengths))
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value)

    def _eval_phase(self, started):
        """Evaluates in rounds: each round restarts every agent and counts the first episode
        of each of its first `min(batch, eval_episodes - counted)` agents (chosen by number,
        not by which finish first, so that short episodes are not over-represented), and
        ends when those have finished; rounds repeat until `eval_episodes` episodes are
        counted. `started`: when `run` began (`time.time()`)."""
        self._is_training.assign(False)
        self._should_log.assign(False)
        batch = len(self._batch_env)
        scores, lengths = [], []
        steps, start_time = 0, time.time()
        while len(scores) < self._eval_episodes:
            counted = min(batch, self._eval_episodes - len(scores))
            first_score = np.full(batch, np.nan, np.float32)
            first_length = np.zeros(batch, np.int64)
            running = np.zeros(batch, np.int64)
            reset = True
            while np.isnan(first_score[:counted]).any():
                self._check_stop()
                count = self._steps_per_call
                dones, call_scores = self._call(False, reset, count)
                reset = False
                steps += count * batch
                for done, score in zip(dones, call_scores, strict=True):
                    running += 1
                    # An episode cut short has a NaN score: the agent's next one counts.
                    new = done & np.isnan(first_score)
                    first_score[new] = score[new]
                    first_length[new] = running[new]
                    running[done] = 0
            scores.extend(first_score[:counted].tolist())
            lengths.extend(first_length[:counted].tolist())
        times = {"time/training_seconds": time.time() - started,
                 "time/tracing_seconds": self._tracing_seconds}
        if self._startup_seconds is not None:
            times["time/startup_seconds"] = self._startup_seconds
        self._write_scores("eval", int(self._step.numpy()), scores, lengths, **times)
        self._writers["eval"].flush()
        return PhaseResult("eval", int(self._step.numpy()), steps, time.time() - start_time,
                           scores, lengths)

    def _compile_ahead(self):
        """Compiles the update that the train phases will run (`compile_ahead` of the
        algorithm; one of the contract alone may have none)."""
        getattr(self._algo, "compile_ahead", lambda: None)()

    def _call(self, log, reset, count):
        """Calls the step function; returns `(done, score)` as NumPy arrays
        `[count, batch]`.

        An environment's error becomes `EnvironmentFailed`.
        """
        try:
            done, score = self._function(
                tf.constant(log), tf.constant(reset), tf.constant(count))
            return done.numpy()[:count], score.numpy()[:count]
        except tf.errors.OpError:
            cause = getattr(self._batch_env, "error", None)
            if cause is None:
                raise
            raise EnvironmentFailed(
                f"at step {int(self._step.numpy()):,}: {cause}") from cause

    def _check_stop(self):
        if self._stop is not None and self._stop.is_set():
            raise Interrupted(f"stopped at step {int(self._step.numpy()):,}")

    @staticmethod
    def _collect(done, score, running, scores, lengths):
        """Adds the episodes that ended at this step to `scores` and `lengths`; an episode cut
        short (score NaN, see `simulate`) counts nowhere."""
        running += 1
        ended = done & ~np.isnan(score)
        scores.extend(score[ended].tolist())
        lengths.extend(running[ended].tolist())
        running[done] = 0


def step_function(batch_env, algo, steps_per_call=1, writer=None, step=None,
                  count_steps=True, jit_compile=False):
    """The `tf.function` that runs `steps_per_call` batch steps of `simulate`.

    Args:
      batch_env: an `InGraphBatchEnv` (or an in-graph environment of `batchrl.native_tasks`).
      algo: the algorithm acting on `batch_env`.
      steps_per_call: int >= 1, batch steps of a full call (`simulate_steps`).
      writer: optional summary writer, the default writer inside the function (summaries
        are written only where `log` is true).
      step: optional int64 variable, the summaries' step.
      count_steps: with a `step`, add the environment steps taken (`count * len(batch_env)`)
        to it in every call.
      jit_compile: compile the function with XLA (`tf.function(jit_compile=True)`). Every
        op must then have an XLA kernel: no `tf.numpy_function` (use `batchrl.native_tasks`) and no
        summaries (`writer` must be None; `log` is ignored).

    Returns:
      `tf.function(log, reset, count) -> (done, score)` taking bool scalars `log` (write
      the episode summaries at the end of the call) and `reset` (begin new episodes for
      all agents first) and the int32 scalar `count` in `[0, steps_per_call]`, the steps
      to run; it returns bool and float32 `[steps_per_call, batch]` (rows from `count` on
      are False and 0). It is traced once.

    Raises:
      ValueError: `jit_compile` with a `writer`.
    """
    if jit_compile and writer is not None:
        raise ValueError("summaries cannot be compiled with XLA: pass writer=None")
    episode_state(batch_env)  # Variables exist before the first trace.
    batch = len(batch_env)
    signature = [tf.TensorSpec([], tf.bool)] * 2 + [tf.TensorSpec([], tf.int32)]

    @tf.function(input_signature=signature, autograph=False, jit_compile=jit_compile)
    def run(log, reset, count):
        summaries = writer.as_default(step=step) if writer else contextlib.nullcontext()
        with summaries:
            done, score = simulate_steps(
                batch_env, algo, steps_per_call, False if jit_compile else log, reset, count)
        if step is not None and count_steps:
            with tf.control_dependencies([done, score]):
                step.assign_add(tf.cast(count * batch, step.dtype))
        return done, score

    return run
