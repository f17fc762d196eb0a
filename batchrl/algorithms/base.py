"""The algorithm contract of DESIGN.md ("Algorithms") in code: `Algorithm`, which every
algorithm of batchrl subclasses (`OnPolicyAlgorithm` for PPO, TRPO, A2C and those of
`build_algorithm`; `OffPolicyAlgorithm` for SAC, TD3 and DQN), and what both families do
the same way: the observation filter, the compiled update and its summaries."""

import abc
import os
import tempfile

import tensorflow as tf

from batchrl.spaces import nested
from batchrl.tools.graph import after
from batchrl.tools.streaming import StreamingNormalize


class Algorithm(abc.ABC):
    """An algorithm as `batchrl.drivers.simulate` drives it, and its learning as a
    function of a batch.

    Constructed as `Algorithm(batch_env, step, is_training, should_log, config)`:
    `batch_env` an in-graph batch environment, `step` the global step variable (int64,
    training environment steps; summaries are written at its value), `is_training` and
    `should_log` bool scalar tensors or variables (summaries are recorded only while
    `should_log`), `config` a `batchrl.configs.Config`. The acting methods are graph code
    that take agent indices (int32 `[n]`, the batch rows concerned), so that an algorithm
    also serves a `simulate` that steps only the environments that are ready.

    Learning is `update(batch) -> diagnostics`, one function of a batch, whatever the
    batch's origin: the on-policy family builds it from its episode memory
    (`OnPolicyAlgorithm._memory_batch`), the off-policy family samples it from its replay
    memory. What an actor recorded elsewhere comes in through one method, `learn`, which
    takes the recording as the actor's recorder made it and learns from it as the
    algorithm learns from its own steps.

    `batchrl.build` accepts a subclass of `Algorithm`, and also, for algorithms written
    before this class, any class with the four methods `begin_episodes`, `perform`,
    `experience` and `end_episodes` (duck typing; such a class gets none of what is here).

    Attributes:
      name: str, the name scope of the algorithm's variables and of its summaries
        (`NAME/...`); a subclass sets it.
      config_keys: frozenset of str, the config keys the algorithm reads besides those of
        the run (`batchrl.build.algorithm_class` refuses a config that sets another
        algorithm's key that this one does not read); a subclass sets it.
      actors: what the algorithm's Ray actors record and send to `learn` (config key
        `actors` above 0): "fragments" (rollouts; every `OnPolicyAlgorithm` that reads
        `rollout_length` says so by itself), "transitions" (Ape-X's, the
        `OffPolicyAlgorithm`s), or None: it does not learn from actors. The registry's
        entries say the same (`batchrl.algorithms.registry`), for readers without
        TensorFlow.
    """

    name = "algorithm"
    config_keys = frozenset()
    actors = None

    def __init__(self, batch_env, step, is_training, should_log, config):
        self._batch_env = batch_env
        self._step = step
        self._is_training = is_training
        self._should_log = should_log
        self._config = config

    # --- The contract: what simulate, the Agent and export call. ---

    @abc.abstractmethod
    def begin_episodes(self, agent_indices):
        """Agents (int32 `[n]`) that start a new episode; returns a tensor to wait for."""

    @abc.abstractmethod
    def perform(self, agent_indices, observ):
        """Batched inference: actions `[n, *action_shape]` for the given agents (int32
        `[n]`) in raw observations `[n, *observation_shape]`; explored while
        `is_training`, deterministic otherwise.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """

    @abc.abstractmethod
    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """The transitions of the step just taken by the given agents (int32 `[n]`):
        `observ` and `nextob` raw `[n, *observation_shape]` (`nextob` the observation after
        the step, the final one when the episode ended), `action` `[n, *action_shape]`,
        `reward` float32 `[n]`, `done` bool `[n]`. Recorded (and learned from) only while
        `is_training`; returns a tensor to wait for."""

    @abc.abstractmethod
    def end_episodes(self, agent_indices):
        """Agents (int32 `[n]`) whose episode ended at this step; returns a tensor to wait
        for."""

    @abc.abstractmethod
    def policy_action(self, observ, state, generator=None):
        """The deterministic action (or with `generator`, a `tf.random.Generator`, a
        sampled one) for raw observations `[n, *observation_shape]` and recurrent states
        float32 `[n, state_size]`, changing no variable; returns `(action, state)`. For
        acting outside of training and for exported models."""

    @abc.abstractmethod
    def update(self, batch):
        """One update of the learned variables on `batch` (a dict of tensors, whose keys
        each family documents); returns the diagnostics, a dict of float32 scalars (and
        the non-scalar entries its family documents). Graph code; not compiled here (the
        families call it inside their compiled update, `_compile`)."""

    def learn(self, recording, log=False):
        """Learns from a `recording` that an actor made of its steps with a copy of the
        acting half: an on-policy algorithm that learns from actors takes a fragment
        (`batchrl.distributed.fragment.FragmentRecorder.record`) and makes one update on it;
        an off-policy one takes n-step transitions with their first priorities
        (`batchrl.distributed.transitions.TransitionRecorder.record`), stores them and makes
        the updates their steps are owed. With `log`, the update's summaries are written
        (where the family writes them on its own schedule, it keeps that).

        Returns:
          dict: `updates` (int, the updates made) and the update's diagnostics (tensors).

        Raises:
          NotImplementedError: the algorithm does not learn from actors (its `actors` is
            None).
        """
        raise NotImplementedError(f"{type(self).__name__} does not learn from actors' "
                                  f"recordings")

    @property
    @abc.abstractmethod
    def checkpoint_state(self):
        """dict of trackables that define training, for
        `tf.train.Checkpoint(**checkpoint_state)`."""

    @property
    @abc.abstractmethod
    def progress_state(self):
        """dict of trackables of the training in progress that `checkpoint_state` leaves
        out (memories, episodes in progress), for an exactly continued Agent."""

    @property
    def networks(self):
        """The algorithm's `batchrl.networks.Networks`; `policy` is the model that
        `export` saves. A subclass sets `_networks`."""
        return self._networks

    @property
    @abc.abstractmethod
    def state_size(self):
        """int, the size of the policy's recurrent state (0 for a feed-forward policy)."""

    @property
    def actor(self):
        """The acting half (`batchrl.algorithms.actor.Actor`) that `perform` and
        `policy_action` act through: its policy, observation filter and exploration, whose
        weights `get_weights` / `set_weights` read and write. A subclass sets `_acting`."""
        return self._acting

    def compile_ahead(self):
        """Compiles ahead of training what the step function's first update would
        otherwise compile during it (the XLA program of `jit_update`), changing no
        variable; the Loop calls it once, after tracing the step function, so that the
        compilation counts as start-up. This base compiles nothing."""
        return None

    # --- What both families do the same way. ---

    def _undone(self, function):
        """Calls `function()`, then sets every variable of `checkpoint_state` and
        `progress_state` back to its value before the call (through a checkpoint in a
        temporary directory)."""
        checkpoint = tf.train.Checkpoint(**self.checkpoint_state, **self.progress_state)
        with tempfile.TemporaryDirectory() as directory:
            before = checkpoint.write(os.path.join(directory, "before"))
            function()
            checkpoint.read(before).assert_consumed()

    def _if_training(self, train_fn, else_fn):
        """`train_fn()` while `is_training`, `else_fn()` otherwise (`tf.cond`)."""
        return tf.cond(tf.convert_to_tensor(self._is_training), train_fn, else_fn)

    def _while_training(self, function, *args):
        """`function(*args)` while `is_training`, else False: what `experience` and
        `end_episodes` do with a recording function."""
        return self._if_training(lambda: function(*args), lambda: tf.constant(False))

    def _compile(self, function):
        """`function` as a `tf.function` of its own, traced once however many step
        functions call it; compiled with XLA when the algorithm reads `jit_update` and the
        config sets it. Summaries stay outside (XLA compiles no summary op)."""
        return tf.function(function, jit_compile=self._jit_update, autograph=False)

    @property
    def _jit_update(self):
        """bool: the algorithm reads `jit_update` and the config sets it."""
        return bool(self._config.jit_update) if "jit_update" in self.config_keys else False

    def _write_summaries(self, scalars, record, extra=None, filters=()):
        """Writes the float32 scalars of the dict `scalars` under `NAME/` while `record`
        (bool scalar tensor), then the summaries that `extra()` writes (if given, returning
        a list of summary ops) and those of the normalizers `filters`; returns the list of
        summary ops to wait for.

        All of them are written in one `tf.cond`: under `tf.summary.record_if(record)` each
        write would build a `tf.cond` of its own (21 of the 26 conds of the `pendulum`
        config's step function)."""

        def write():
            with tf.summary.record_if(True), tf.name_scope(self.name + "/"):
                written = [tf.summary.scalar(name, value) for name, value in scalars.items()]
                if extra is not None:
                    written += extra()
                for normalizer in filters:
                    normalizer.summary()
            return after(written, True)

        return [tf.cond(tf.convert_to_tensor(record), write, lambda: tf.constant(False))]


def checked(action):
    """`action`, checked to be finite when it is a float tensor.

    Raises:
      tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
    """
    if action.dtype.is_floating:
        action = tf.debugging.check_numerics(action, "non-finite action")
    return action


def observation_filter(observation_space, observ_shape, config):
    """The observation normalizer of both families: running mean and standard deviation,
    clipped to [-observ_clip, observ_clip], element by element, when the config's
    `normalize_observ` (an identity otherwise); only the elements of `Box` leaves of a
    flattened nested observation, and with `normalize_keys` only those entries
    (`batchrl.spaces.nested.normalized_elements`). A `StreamingNormalize` of
    `observ_shape`."""
    return StreamingNormalize(
        observ_shape, center=config.normalize_observ, scale=config.normalize_observ,
        clip=config.observ_clip if config.normalize_observ else None,
        mask=nested.normalized_elements(observation_space, config.get("normalize_keys")),
        name="normalize_observ")

