"""`batchrl.Agent`: an algorithm of a config, for a loop that the application drives."""

import contextlib
import json
import pathlib
import pickle

import gymnasium as gym
import numpy as np
import tensorflow as tf

from batchrl import build as build_lib
from batchrl import configs, spaces
from batchrl import export as export_lib
from batchrl.drivers.simulate import act as simulate_act
from batchrl.drivers.simulate import episode_state
from batchrl.drivers.simulate import observe as simulate_observe
from batchrl.environments.application import ApplicationBatchEnv
from batchrl.networks import spec as network_spec
from batchrl.spaces import nested
from batchrl.spaces.graph import observation_dtype
from batchrl.tools.graph import TracedCall

_CHECKPOINT = "agent"
_HOST_STATE = "host_state.json"


class _Environments(ApplicationBatchEnv):
    """The application's environments as the algorithm sees them (`ApplicationBatchEnv`),
    plus `interrupted`: bool `[num_envs]`, the episodes that the current `observe` drops
    (`simulate.observe` leaves them out of `experience` and `end_episodes`)."""

    def __init__(self, num_envs, observation_space, action_space):
        super().__init__(num_envs, observation_space, action_space)
        self.interrupted = tf.Variable(
            tf.zeros([num_envs], tf.bool), trainable=False, name="interrupted")


class Agent:
    """The config's algorithm (BatchPPO by default; config key `algorithm`) acting in, and
    learning from, `num_envs` environments that the application steps itself.

    The application asks for actions with `act` and reports what happened with `observe`,
    for all of its environments at once; episodes of different environments begin and end
    independently (`act` after an `observe` that ended an environment's episode begins a
    new one for it; `reset` begins new ones in environments whose episodes the application
    ends itself). Each call is one traced `tf.function` around the graph code that
    `simulate` uses (`batchrl.drivers.simulate.act` / `observe`), so the agent learns exactly
    as `train` does: it updates once `update_every` episodes have ended. The global step
    counts environment steps (`num_envs` per `observe`); `lr_schedule: linear` and
    `kl_schedule: linear` decay over the config's `steps`.

    Training episodes and deterministic (evaluation) steps: a training episode is made of
    sampled steps (`act()` then `observe`) only. The first `act(deterministic=True)` after
    sampled steps ends every training episode in progress there, as truncated: its value
    is bootstrapped from the last `final_observation` it was given, and its score is not
    recorded in the `mean_score` summary (it is not a whole episode). The next sampled
    `act` begins new training episodes, so that no stored episode spans deterministic
    steps or a reset of the environment. A recurrent policy's deterministic steps run on a
    recurrent state of their own, one per environment, advanced by every
    `act(deterministic=True)` and zeroed by `reset` and by an `observe` after a
    deterministic action that ends the episode.

    The Agent leaves the process alone: creating or loading one reseeds none of Python's,
    NumPy's or TensorFlow's global random generators (the weights follow from `seed`, the
    actions from the algorithm's own generator), and `eager: true` runs only the Agent's
    own calls eagerly (the process's `tf.config.functions_run_eagerly()` is switched for
    the duration of each call and restored after; not thread-safe).

    For a `Box` action space with finite bounds the policy acts in [-1, 1], as in `train`:
    actions are clipped to [-1, 1] and mapped to the space's bounds before they are
    returned (the unclipped action is what the agent learns from).

    Nested spaces work as in `train` (`batchrl.spaces`): observations of a `Dict` / `Tuple`
    (leaves `Box`, `Discrete`, `MultiDiscrete`, `MultiBinary`) or a `Discrete` space are
    given as the space nests them, each leaf with the leading `num_envs` dimension, and
    flattened in the graph (`Discrete` leaves one-hot, `Box` leaves normalized element by
    element); actions of such a space (network `feed_forward_composite`) come back nested
    the same way.

    Build one with `Agent.create` or `Agent.load`.

    Args:
      config: a validated `Config` (its `num_agents` is the number of environments).
      observation_space: the space of one environment: `Box`, `Discrete`, `MultiDiscrete`,
        `MultiBinary`, or `Dict` / `Tuple` of these (nested).
      action_space: the space of one environment: `Box`, `Discrete`, `MultiDiscrete`,
        `MultiBinary`, or `Dict` / `Tuple` of these (nested).
      logdir: optional directory for TensorBoard summaries (scores, losses, KL).

    Raises:
      ConfigError: the config's network does not fit the spaces, a space is not supported
        (the message names the leaf), or config key `max_length` (the longest episode of
        the application's environments) is not set: the Agent never reads the config's
        `env`; or a `frame_stack` preprocessing step (the application stacks its frames).
    """

    def __init__(self, config, observation_space, action_space, logdir=None):
        if not config.max_length:
            raise configs.ConfigError(
                "batchrl.Agent needs config key 'max_length', the longest episode of the "
                "application's environments (e.g. max_length=env.spec.max_episode_steps); "
                "it does not read the config's env")
        if network_spec.plan(config.preprocessing).frames:
            raise configs.ConfigError(
                "batchrl.Agent takes the observations the application gives it: stack the "
                "frames there (e.g. gymnasium.wrappers.FrameStackObservation) and remove "
                "the frame_stack step from config key 'preprocessing'")
        self._config = config
        self._num_envs = int(config.num_agents)
        self.observation_space = observation_space
        self.action_space = action_space
        try:
            policy_observation_space = spaces.policy_observation_space(observation_space)
            policy_action_space = spaces.policy_action_space(action_space)
        except ValueError as error:
            raise configs.ConfigError(str(error)) from None
        self._nested = not isinstance(observation_space, gym.spaces.Box)
        self._observ_shape = tuple(observation_space.shape or ())
        # float32, or uint8 for the images and binary frames of a uint8 or bool Box.
        self._observ_dtype = (np.float32 if self._nested else
                              observation_dtype(observation_space).as_numpy_dtype)
        self._batch_env = _Environments(
            self._num_envs, policy_observation_space, policy_action_space)
        self._built = build_lib.build(config, self._batch_env, process_eager=False)
        self._algo = self._built.algo
        self._max_length = int(config.max_length)
        self._logdir = logdir
        self._writer = (tf.summary.create_file_writer(str(logdir)) if logdir is not None
                        else tf.summary.create_noop_writer())
        self._built.should_log.assign(logdir is not None)
        self._eval_state = tf.Variable(
            tf.zeros([self._num_envs, self._algo.state_size]), trainable=False)
        episode = episode_state(self._batch_env)
        self._checkpoint = tf.train.Checkpoint(
            agent=self._built.checkpoint,
            progress=tf.train.Checkpoint(**self._algo.progress_state),
            batch=tf.train.Checkpoint(
                observ=self._batch_env.observ, action=self._batch_env.action,
                reward=self._batch_env.reward, done=self._batch_env.done,
                terminated=self._batch_env.terminated, score=episode.score,
                length=episode.length),
            eval_state=self._eval_state)
        self._pending = None  # "train" after act, "eval" after act(deterministic=True).
        self._add_transitions = None  # Traced at the first `update`.
        # The steps of each environment's training episode in progress: 0 exactly where
        # `batch_env.done` is set (no episode in progress; the next sampled act begins one).
        self._lengths = np.zeros(self._num_envs, np.int64)
        self._last_log = 0
        self._trace()

    @classmethod
    def create(cls, config, observation_space, action_space, num_envs, seed=0, logdir=None,
               **overrides):
        """A new agent.

        Args:
          config: a config name under `configs/`, a path to a YAML file, or a dict of keys
            layered over `configs/default.yaml`.
          observation_space, action_space: the spaces of one environment (see `Agent`).
          num_envs: int >= 1, the environments the application steps at once.
          seed: int, seeds the networks and the action sampling (local generators: the
            process's global ones are left as they are).
          logdir: optional directory for TensorBoard summaries.
          **overrides: config keys, validated like `--set`. `max_length` (the longest
            episode of the application's environments, e.g. their
            `spec.max_episode_steps`) is required, here or in the config.

        Raises:
          ConfigError: unknown config, key or value, a network that does not fit the
            spaces, or no `max_length`.
        """
        overrides = dict(overrides, num_agents=num_envs, seed=seed)
        if isinstance(config, dict):
            config = configs.load("default", {**config, **overrides})
        else:
            config = configs.load(str(config), overrides)
        return cls(config, observation_space, action_space, logdir)

    @property
    def config(self):
        """The agent's validated `Config`."""
        return self._config

    @property
    def step(self):
        """int, the environment steps observed while training (all environments count)."""
        return int(self._built.step.numpy())

    def act(self, observation, deterministic=False):
        """The actions of all environments for their current observations.

        Args:
          observation: `[num_envs, *observation_shape]` array (cast to float32, or to uint8
            for a uint8 or bool `Box`: images and binary frames); for a
            nested space, a dict / tuple nested as the space with such an array per leaf
            (`Discrete` leaves: integers `[num_envs]`).
          deterministic: the mean (mode) action, recording nothing (training episodes in
            progress end here, see `Agent`); else a sampled action that the next `observe`
            completes.

        Returns:
          numpy `[num_envs, *action_shape]`: float32 within the `Box`'s bounds, or int32
          for `Discrete`; for a nested space, its nesting of such arrays (`MultiDiscrete`:
          int32, `MultiBinary`: int8; see `batchrl.spaces.to_action_space`).

        Raises:
          ValueError: the observation (or a leaf of it, named) has the wrong shape or
            structure, is not finite, or is outside its `Discrete` range.
          RuntimeError: `act` while a sampled action still waits for its `observe`.
        """
        observ = self._check_observation(observation, "observation")
        if self._pending == "train":
            raise RuntimeError(
                "act() called again before observe(): report the result of the last action "
                "first")
        with self._mode():
            if deterministic:
                self._end_training_episodes(self._lengths > 0)
                action = self._act_deterministic(observ)
                self._pending = "eval"
            else:
                action = self._act_sampled(observ)
                self._pending = "train"
            return tf.nest.map_structure(lambda tensor: tensor.numpy(), action)

    def observe(self, reward, terminated, truncated, final_observation=None):
        """Reports the step that the actions of the last `act` led to.

        After a sampled action the step is recorded, and the agent updates once the memory
        holds `update_every` finished episodes. After a deterministic action nothing is
        recorded; ended episodes only reset the recurrent state.

        Args:
          reward: `[num_envs]` float rewards.
          terminated: `[num_envs]` bools, the episode ended in a terminal state.
          truncated: `[num_envs]` bools, the episode was cut off (a time limit).
          final_observation: `[num_envs, *observation_shape]` (nested as in `act`), the
            observation after the step: for an ended episode its final observation,
            before the environment's reset. Required after a sampled `act`, for every
            algorithm: it is the next observation of each stored transition (the replay
            memory's `nextob`, the `next_observ` of PPO's rollouts) and the observation
            that the value of a truncated episode, or of one that a later `reset` or
            deterministic `act` cuts short, is bootstrapped from. Ignored after a
            deterministic `act`.

        Returns:
          numpy bool `[num_envs]`, the episodes that ended (terminated or truncated).

        Raises:
          RuntimeError: no `act` came before.
          ValueError: wrong shapes or non-finite rewards or observations, or no
            `final_observation` after a sampled `act` (nothing is recorded; `observe` may
            be called again); or episodes longer than the config's `max_length`: raised
            after the step is recorded for the other environments, the episodes of the
            environments named are dropped, nothing else is lost, and the next `act`
            begins new episodes for them.
        """
        if self._pending is None:
            raise RuntimeError("observe() without act(): call act() for the step first")
        shape = (self._num_envs,)
        reward = self._check_array(reward, "reward", shape)
        terminated = self._check_flags(terminated, "terminated")
        truncated = self._check_flags(truncated, "truncated")
        done = terminated | truncated
        if self._pending == "eval":
            with self._mode():
                self._reset_eval_state(done)
            self._pending = None
            return done
        if final_observation is None:
            raise ValueError(
                "observe() after a sampled act() needs final_observation, the observation "
                "after the step (before any reset): the agent learns from it; nothing was "
                "recorded")
        nextob = self._check_observation(final_observation, "final_observation")
        if self._nested:
            nextob = self._flatten(nextob)
        lengths = self._lengths + 1
        drop = lengths > self._max_length  # The step does not fit the episode's memory.
        step = self.step + self._num_envs
        log = self._logdir is not None and (
            step // self._config.log_every > self._last_log // self._config.log_every)
        with self._mode():
            self._observe(reward, terminated, truncated, nextob, drop, tf.constant(log))
        if log:
            self._last_log = step
        self._lengths = np.where(done | drop, 0, lengths)
        self._pending = None
        if drop.any():
            raise ValueError(
                f"the episodes of environments {np.flatnonzero(drop).tolist()} passed "
                f"max_length={self._max_length} steps without ending and were dropped (the "
                f"next act() begins new ones; the other environments' step was recorded): "
                f"set max_length (config key) to the longest episode")
        return done

    def reset(self, indices=None):
        """Begins new episodes in the given environments, for an application that resets
        them itself (an episode it cuts short, or before an evaluation).

        For each environment: its deterministic (evaluation) recurrent state becomes zero,
        so that the next `act(deterministic=True)` begins an episode; a training episode in
        progress there ends, as truncated (its value is bootstrapped from the last
        `final_observation` it was given; stored for the next update, which may run now;
        its score is not recorded in the `mean_score` summary), and the next sampled `act`
        begins a new one. Environments without an episode in progress are unaffected.

        Args:
          indices: environment indices (ints in `[0, num_envs)`, no duplicates), or None
            for all environments.

        Raises:
          RuntimeError: between a sampled `act` and its `observe`.
          ValueError: an index out of range or given twice.
        """
        if self._pending == "train":
            raise RuntimeError(
                "reset() between act() and observe(): report the result of the last sampled "
                "action first")
        mask = self._index_mask(indices)
        with self._mode():
            self._end_training_episodes(mask & (self._lengths > 0))
            self._reset_eval_state(mask)

    def update(self, batch):
        """Adds transitions from outside (demonstrations, logged data) to the replay memory
        of an off-policy algorithm (sac, td3, dqn) and runs the updates they are owed, as
        stepped ones are (`updates_per_step` per transition once the memory holds
        `learning_starts`). Each is stored as a one-step transition: a terminated one does
        not bootstrap, any other does from its `next_observation`.

        Args:
          batch: a dict of `observation` `[n, *observation_shape]` (nested as in `act`),
            `action` `[n, *action_shape]` in the action space (`Box`: within its bounds;
            `Discrete`: ints), `reward` `[n]`, `terminated` `[n]` bools and
            `next_observation` (as `observation`).

        Returns:
          int, the agent's gradient updates so far.

        Raises:
          TypeError: the algorithm learns from its own episodes (no replay memory).
          ValueError: a missing or unknown key, wrong shapes, non-finite values, actions
            outside the space (nothing is stored).
        """
        if not hasattr(self._algo, "add_transitions"):
            raise TypeError(
                f"Agent.update(batch) needs an algorithm with a replay memory (sac, td3, "
                f"dqn); {self._config.algorithm!r} learns from its own episodes")
        keys = {"observation", "action", "reward", "terminated", "next_observation"}
        if set(batch) != keys:
            raise ValueError(f"batch needs exactly the keys {sorted(keys)}; missing "
                             f"{sorted(keys - set(batch))}, unknown {sorted(set(batch) - keys)}")
        reward = np.asarray(batch["reward"], np.float32)
        if reward.ndim != 1 or not np.isfinite(reward).all():
            raise ValueError(f"reward must be finite numbers [n], got shape {reward.shape}")
        count = len(reward)
        transitions = {
            "observ": self._batch_observation(batch["observation"], "observation", count),
            "nextob": self._batch_observation(
                batch["next_observation"], "next_observation", count),
            "action": spaces.from_action_space(batch["action"], self.action_space),
            "reward": reward,
            "terminated": self._check_flags(batch["terminated"], "terminated", count),
        }
        if len(transitions["action"]) != count:
            raise ValueError(f"action has {len(transitions['action'])} rows, reward {count}")
        if self._add_transitions is None:
            self._add_transitions = tf.function(
                self._add_transitions_graph, reduce_retracing=True, autograph=False)
        with self._mode():
            self._add_transitions(transitions)
        return int(self._algo.updates.numpy())

    def _batch_observation(self, value, name, count):
        """Observations of `count` transitions, as the policy sees them (float32, flat)."""
        if not self._nested:
            return self._check_array(value, name, (count,) + self._observ_shape,
                                     self._observ_dtype)
        checked = nested.check_batch(self.observation_space, value, count, name)
        return spaces.to_policy_observation(checked, self.observation_space).numpy()

    def _add_transitions_graph(self, transitions):
        with self._writer.as_default(step=self._built.step):
            return self._algo.add_transitions(transitions)

    def save(self, directory):
        """Writes everything the agent needs to continue exactly where it is to `directory`:
        the config, the spaces, the weights and optimizer state, the normalizers, the KL
        penalty, the episodes in progress and the memory.

        Returns:
          the directory, a `pathlib.Path`.
        """
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.yaml").write_text(configs.dump(self._config))
        (directory / "spaces.pkl").write_bytes(
            pickle.dumps((self.observation_space, self.action_space)))
        host = {"pending": self._pending, "lengths": self._lengths.tolist(),
                "last_log": self._last_log}
        (directory / _HOST_STATE).write_text(json.dumps(host))
        self._checkpoint.write(str(directory / _CHECKPOINT))
        return directory

    @classmethod
    def load(cls, directory, observation_space=None, action_space=None, logdir=None):
        """The agent that `save` wrote to `directory`.

        Args:
          directory: what `save` was given.
          observation_space, action_space: optional, the spaces the application will use;
            they must equal the saved agent's.
          logdir: optional directory for TensorBoard summaries.

        Raises:
          FileNotFoundError: `directory` holds no saved agent.
          ValueError: a given space differs from the saved agent's.
        """
        directory = pathlib.Path(directory)
        if not (directory / "spaces.pkl").is_file():
            raise FileNotFoundError(f"{directory} holds no saved agent (no spaces.pkl)")
        saved = pickle.loads((directory / "spaces.pkl").read_bytes())
        for name, given, stored in zip(("observation_space", "action_space"),
                                       (observation_space, action_space), saved, strict=True):
            if given is not None and given != stored:
                raise ValueError(
                    f"{name} {given} does not match the saved agent's {stored} ({directory})")
        config = configs.read_run_config(directory / "config.yaml")
        agent = cls(config, *saved, logdir=logdir)
        agent._checkpoint.read(str(directory / _CHECKPOINT)).assert_consumed()
        host = json.loads((directory / _HOST_STATE).read_text())
        agent._pending = host["pending"]
        agent._lengths = np.array(host["lengths"], np.int64)
        agent._last_log = host["last_log"]
        return agent

    def export(self, directory, seed=0):
        """Writes the policy as a SavedModel for serving (`batchrl.export.export_policy`):
        `serving_default` maps `observation` float32 `[None, *observation_shape]` (uint8
        for a uint8 or bool `Box`: frames) to the `action` that `act(observation,
        deterministic=True)` returns, `sample` to a sampled one; a recurrent policy also
        takes and returns `state`; nested spaces have an input per observation leaf and an
        output per action leaf. It loads with `tf.saved_model.load` without batchrl.

        Returns:
          the directory, as given.
        """
        with self._mode():
            return export_lib.export_policy(
                self._algo, self.observation_space, self.action_space, directory, seed)

    def close(self):
        """Flushes and closes the summary writer."""
        self._writer.flush()
        self._writer.close()

    @contextlib.contextmanager
    def _mode(self):
        """Runs the block's `tf.function`s eagerly exactly when the config says `eager`,
        restoring the process's setting after."""
        before = tf.config.functions_run_eagerly()
        eager = bool(self._config.eager)
        if before != eager:
            tf.config.run_functions_eagerly(eager)
        try:
            yield
        finally:
            if before != eager:
                tf.config.run_functions_eagerly(before)

    def _end_training_episodes(self, mask):
        """Ends the training episodes in progress of the environments of `mask` (numpy
        bool `[num_envs]`, only where `self._lengths > 0`) as truncated, and marks them so
        that the next sampled `act` begins new ones."""
        if mask.any():
            self._end_episodes(mask)
            self._lengths = np.where(mask, 0, self._lengths)

    def _index_mask(self, indices):
        """numpy bool `[num_envs]`, True at `indices` (None: everywhere)."""
        mask = np.zeros(self._num_envs, bool)
        if indices is None:
            mask[:] = True
            return mask
        array = np.asarray(indices)
        if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"indices must be a list of ints, got {indices!r}")
        outside = array[(array < 0) | (array >= self._num_envs)]
        if outside.size:
            raise ValueError(
                f"indices {outside.tolist()} outside [0, {self._num_envs}) (num_envs)")
        values, counts = np.unique(array, return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"indices {values[counts > 1].tolist()} given twice")
        mask[array.astype(np.int64)] = True
        return mask

    # Graph functions, traced once each (`_trace`).

    def _trace(self):
        observ_spec = spaces.observation_spec(self.observation_space, self._num_envs)
        flat_spec = tf.TensorSpec(self._batch_env.observ.shape, self._batch_env.observ.dtype)
        flags = tf.TensorSpec([self._num_envs], tf.bool)
        # Without autograph, as the Loop's step function: the graph code has no Python
        # control flow on tensors, and autograph's conversion would double the tracing time.
        # Each is called through its traced graph (`TracedCall`; eagerly under `eager`).
        def function(python_function, input_signature):
            return TracedCall(tf.function(python_function, input_signature=input_signature,
                                          autograph=False))
        self._act_sampled = function(self._act_graph, input_signature=[observ_spec])
        self._act_deterministic = function(
            self._act_deterministic_graph, input_signature=[observ_spec])
        self._flatten = function(
            lambda observ: spaces.to_policy_observation(observ, self.observation_space),
            input_signature=[observ_spec])
        self._observe = function(self._observe_graph, input_signature=[
            tf.TensorSpec([self._num_envs], tf.float32), flags, flags, flat_spec, flags,
            tf.TensorSpec([], tf.bool)])
        self._reset_eval_state = function(
            self._reset_eval_state_graph, input_signature=[flags])
        self._end_episodes = function(self._end_episodes_graph, input_signature=[flags])

    def _act_graph(self, observation):
        observ = spaces.to_policy_observation(observation, self.observation_space)
        action = simulate_act(self._batch_env, self._algo, observ)
        return spaces.to_action_space(action, self.action_space)

    def _act_deterministic_graph(self, observation):
        observ = spaces.to_policy_observation(observation, self.observation_space)
        action, state = self._algo.policy_action(observ, self._eval_state)
        with tf.control_dependencies([self._eval_state.assign(state)]):
            action = tf.identity(action)
        return spaces.to_action_space(action, self.action_space)

    def _observe_graph(self, reward, terminated, truncated, nextob, drop, log):
        """`simulate.observe`, leaving out the episodes of `drop` (bool `[num_envs]`):
        nothing of them is stored, and they are marked done so that the next `act` begins
        new ones."""
        with self._writer.as_default(step=self._built.step):
            counted = self._built.step.assign_add(self._num_envs)
            marked = self._batch_env.interrupted.assign(drop)
            with tf.control_dependencies([counted, marked]):
                done, _ = simulate_observe(
                    self._batch_env, self._algo, reward, terminated,
                    tf.logical_or(truncated, drop), nextob, log)
        return done

    def _end_episodes_graph(self, ended):
        """`algo.end_episodes` for the environments of `ended` (bool `[num_envs]`, episodes
        in progress whose last step was not terminal, so they are stored as truncated),
        then sets their `done` flags."""
        with self._writer.as_default(step=self._built.step):
            indices = tf.cast(tf.reshape(tf.where(ended), [-1]), tf.int32)
            stored = self._algo.end_episodes(indices)
            deps = [x for x in tf.nest.flatten(stored) if x is not None]
            with tf.control_dependencies(deps):
                done = tf.logical_or(self._batch_env.done, ended)
            return self._batch_env.done.assign(done)

    def _reset_eval_state_graph(self, done):
        keep = 1.0 - tf.cast(done, tf.float32)[:, None]
        return self._eval_state.assign(self._eval_state * keep)

    # Input checks.

    def _check_observation(self, value, name):
        """The observation as arrays of the dtypes of `spaces.observation_spec`."""
        if not self._nested:
            return self._check_array(value, name, (self._num_envs,) + self._observ_shape,
                                     self._observ_dtype)
        return nested.check_batch(self.observation_space, value, self._num_envs, name)

    def _check_array(self, value, name, shape, dtype=np.float32):
        array = np.asarray(value)
        if array.shape != shape:
            raise ValueError(f"{name} of shape {array.shape}, expected {shape}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            rows = np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(1))
            raise ValueError(f"{name} is not finite for environments {rows.tolist()}")
        return array.astype(dtype, copy=False)

    def _check_flags(self, value, name, count=None):
        array = np.asarray(value)
        count = self._num_envs if count is None else count
        if array.shape != (count,):
            raise ValueError(f"{name} of shape {array.shape}, expected ({count},)")
        if array.dtype != bool and not np.isin(array, (0, 1)).all():
            raise ValueError(f"{name} must hold booleans, got {array.tolist()}")
        return array.astype(bool)
