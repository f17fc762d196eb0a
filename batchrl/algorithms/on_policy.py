"""What on-policy algorithms share: acting, normalizing, and collecting whole episodes in
the graph until an update.

Hafner, Davidson, Vanhoucke, "TensorFlow Agents: Efficient Batched Reinforcement Learning
in TensorFlow", arXiv:1709.02878, section 4 (episodes kept in variables, trained on in the
graph); Heess et al., arXiv:1707.02286 (streaming normalization).
"""

import tensorflow as tf

from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms.actor import OnPolicyActor
from batchrl.algorithms.base import Algorithm
from batchrl.algorithms.fragment_learning import FragmentLearning
from batchrl.memories.episode import EpisodeMemory
from batchrl.memories.observation_storage import ObservationStorage
from batchrl.memories.rollout import RolloutMemory, running_return, zero_returns
from batchrl.spaces import nested
from batchrl.tools import summaries as summaries_lib
from batchrl.tools.graph import after
from batchrl.tools.streaming import StreamingNormalize


class OnPolicyAlgorithm(FragmentLearning, Algorithm):
    """The `begin_episodes / perform / experience / end_episodes` of an algorithm that
    learns from whole episodes of its current policy; a subclass adds `update(batch)`.

    While `is_training` is true, `experience` appends each agent's transitions to its
    current episode and updates the observation and reward normalizers; `end_episodes`
    moves finished episodes into a memory of `update_every` episodes (further episodes that
    end at the same step are dropped) and, once it is full, calls `_train()` (graph code
    returning a tensor to wait for), which reads the memory as a batch (`_memory_batch`),
    runs the subclass's `update(batch)` on it, empties the memory and writes the
    summaries. While `is_training` is false,
    `perform` returns the mode (mean) action and nothing is recorded.

    A recurrent policy (`policy.state_size > 0`) keeps one state per agent, reset to zero
    in `begin_episodes` and advanced in `perform`; the state each step was acted on is
    stored with the step (field `state`).

    Observations are normalized with a running mean and standard deviation and clipped to
    [-observ_clip, observ_clip], element by element (for a flattened nested observation,
    `batchrl.spaces.nested.FlatObservationSpace`, only the elements of its `Box` leaves: the
    one-hot and binary elements stay 0 / 1); rewards are scaled by a running standard deviation and
    clipped to [-reward_clip, reward_clip] (each switchable in the config). The standard
    deviation is that of the rewards (`reward_normalizer: reward`, Hafner et al.) or of each
    agent's discounted return so far, r_t + discount * R_{t-1} from the start of its episode
    (`reward_normalizer: return`, the "reward scaling" of Engstrom et al., "Implementation
    Matters in Deep Policy Gradients", ICLR 2020, section 3). The memory stores the
    normalized observations and the raw rewards (`self._reward_filter.transform` scales
    them), the action, the parameters of the policy that acted (`policy_` + each name of
    the distribution's parameters), and per episode the normalized final observation
    (`self._memory_final`) and whether it terminated (`self._memory_terminated`), from
    which the value after the last step is bootstrapped.

    Args:
      batch_env: an `InGraphBatchEnv` (its `terminated` variable tells terminal states).
      step: the global step variable (summaries are written at its value).
      is_training: bool scalar tensor or variable.
      should_log: bool scalar tensor or variable; summaries are recorded only when true.
      config: object with the attributes `network` (a constructor from
        `batchrl.networks`), `max_length`, `update_every`, `discount`,
        `normalize_observ`, `normalize_reward`, `observ_clip`, `reward_clip`,
        `reward_normalizer` (`reward` or `return`) and `seed`, plus whatever the network
        and the subclass read; for a subclass that declares it in `config_keys`,
        `chunk_length` (episodes are stored padded to a multiple of it; None:
        `max_length`). Optional `normalize_keys`: the `Dict` entries `normalize_observ`
        normalizes (`batchrl.spaces.nested.normalized_elements`; absent or None: all).

    The update's skeleton is shared too: `_train` runs `_update` (`_memory_update`,
    compiled once, with XLA when the config's `jit_update` is true and the subclass reads
    it), which decays the learning rates (`lr_schedule`, `_schedule_learning_rates`),
    reads the memory as a batch (`_memory_batch`), calls `update(batch)` and empties the
    memory, and writes the summaries; `_build_optimizers` keeps the policy's and the value
    network's optimizers (checkpointed with `checkpoint_state`).

    `update(batch)` takes the batch of `_memory_batch` and returns a dict of float32
    scalars for the summaries, the float32 `[episodes, time]` `mask` of the valid steps,
    and the tensors named in `histograms` (`[episodes, time, ...]`; absent ones are
    skipped).

    Attributes:
      histograms: tuple of str, the entries of `update`'s result that `_train` writes as
        histograms over the valid steps (the others but `mask` are scalars).
      stored_state_rollouts: bool, the subclass learns a recurrent policy from rollouts
        (`rollout_length`) by replaying each step from its stored `state`; otherwise a
        recurrent policy with `rollout_length` is refused (rows that run across episode
        ends cannot be replayed as sequences).
      config_keys: frozenset of str, the config keys the algorithm reads other than those
        of the run (`env`, `steps`, `seed`, `max_length`, ...) and the hidden layers
        (`policy_layers`, `value_layers`, `activation`), which the off-policy algorithms
        read too; `network` and its initializers are listed, which they do not.
        `batchrl.build.algorithm_class` refuses a config that sets one of another
        algorithm's keys to other than its default when this algorithm does not read it; a
        subclass that reads more keys adds them.
    """

    name = "on_policy"  # The name scope of the variables and of the summaries.
    actor_class = OnPolicyActor  # The acting half; an actor process builds it alone.
    histograms = ("advantage",)
    stored_state_rollouts = False
    config_keys = frozenset({
        "update_every", "discount", "normalize_observ", "normalize_reward", "observ_clip",
        "reward_clip", "reward_normalizer", "network", "init_std", "init_mean_factor",
        "orthogonal_init"})

    def __init_subclass__(cls, **kwargs):
        """An on-policy algorithm that reads `rollout_length` learns from actors'
        fragments (`learn`), unless its class says otherwise (`actors`)."""
        super().__init_subclass__(**kwargs)
        if "actors" not in vars(cls):
            cls.actors = "fragments" if "rollout_length" in cls.config_keys else None

    def __init__(self, batch_env, step, is_training, should_log, config):
        super().__init__(batch_env, step, is_training, should_log, config)
        num_agents = len(batch_env)
        observ_shape = tuple(batch_env.observ.shape[1:])
        action_shape = tuple(batch_env.action.shape[1:])
        self._random = tf.random.Generator.from_seed(config.seed)
        # The acting half: the networks, the observation filter, sampling.
        self._acting = self.actor_class(
            batch_env.observation_space, batch_env.action_space, config, self._random, step,
            observ_shape, batch_env.observ.dtype, num_agents)
        self._networks = self._acting.networks
        self._distribution = self._networks.distribution
        self._observ_filter = self._acting.observ_filter
        # Observations that are not floats (images, binary frames) and not normalized are
        # stored in their own dtype; the networks convert them.
        self._raw_observ = self._acting.raw_observ
        stored_dtype = batch_env.observ.dtype if self._raw_observ else tf.float32
        normalized = nested.normalized_elements(batch_env.observation_space,
                                                config.get("normalize_keys"))
        # The memories keep the byte elements of a nested observation (its images) as uint8,
        # where the normalizer leaves them as they are.
        self._observ_storage = ObservationStorage.for_space(
            batch_env.observation_space, observ_shape, stored_dtype,
            normalized if config.normalize_observ else None)
        self._reward_filter = StreamingNormalize(
            (), center=False, scale=config.normalize_reward,
            clip=config.reward_clip if config.normalize_reward else None,
            name="normalize_reward")

        self._state_size = self._acting.state_size
        self._recurrent = self._state_size > 0
        self._param_shapes = self._acting.param_shapes
        self._rollout_length = (config.rollout_length if "rollout_length" in self.config_keys
                                else None)
        if self._rollout_length and self._recurrent and not self.stored_state_rollouts:
            raise ValueError("rollout_length needs a feed-forward policy; a recurrent one "
                             "trains on whole episodes (rollout_length: null)")
        sequence = self._rollout_length or config.max_length
        chunk_length = config.chunk_length if "chunk_length" in self.config_keys else None
        self._chunk_length = chunk_length or sequence
        # Episodes (rollouts) are stored padded to a whole number of chunks.
        chunks = -(-sequence // self._chunk_length)
        self._memory_length = chunks * self._chunk_length
        # Rows of the memory: `update_every` episodes, or one rollout of each agent.
        self._memory_rows = num_agents if self._rollout_length else config.update_every
        action_spec = (action_shape, batch_env.action.dtype)
        with tf.name_scope(self.name):
            if self._rollout_length:
                self._episodes = None
                self._memory = RolloutMemory(
                    self._observ_storage.specs, action_spec, self._acting.acting_specs,
                    num_agents, self._memory_length, "memory")
            else:
                template = {**self._observ_storage.specs("observ"), "action": action_spec,
                            "reward": ((), tf.float32), **self._acting.acting_specs}
                self._episodes = EpisodeMemory(
                    template, num_agents, self._memory_length, "episodes")
                self._memory = EpisodeMemory(
                    template, self._memory_rows, self._memory_length, "memory")
            # Normalized final observation and terminal flag of each agent's episode, and
            # of each episode in the memory: what the value bootstraps from.
            self._episode_final = tf.Variable(
                tf.zeros((num_agents,) + observ_shape, stored_dtype), trainable=False,
                name="episode_final")
            self._episode_terminated = tf.Variable(
                tf.zeros([num_agents], tf.bool), trainable=False, name="episode_terminated")
            self._memory_final = tf.Variable(
                tf.zeros((config.update_every,) + observ_shape, stored_dtype), trainable=False,
                name="memory_final")
            self._memory_terminated = tf.Variable(
                tf.zeros([config.update_every], tf.bool), trainable=False,
                name="memory_terminated")
            self._memory_index = tf.Variable(0, dtype=tf.int32, trainable=False,
                                             name="memory_index")
            # Each agent's discounted return since its episode began (reward_normalizer:
            # return); rebuilt by playing, like the episodes in progress.
            self._return = tf.Variable(
                tf.zeros([num_agents]), trainable=False, name="discounted_return")
        self._policy_optimizer = self._value_optimizer = None  # Set by `_build_optimizers`.
        # With `jit_update`, XLA compiles the update's many small ops (minibatch steps of
        # small networks) into a few kernels.
        self._update = self._compile(self._memory_update)
        self._all_reduce = None  # Learners that share the update (IMPALA.share_update).
        self._learn = self._compile(self._fragment_update)  # `learn`'s, on a fragment.
        self._learn_and_log = tf.function(self._fragment_learn, autograph=False)

    @property
    def checkpoint_state(self):
        """Trackables that define training, for `tf.train.Checkpoint(**checkpoint_state)`.

        With `_build_optimizers`, also the optimizers (their state, e.g. Adam's moments).
        Episodes in progress, the recurrent states and the memory are left out: they are
        rebuilt by playing (every phase of the Loop begins new episodes for all agents).
        """
        return {
            "policy": self._networks.policy,
            "value": self._networks.value,
            "observ_filter": self._observ_filter,
            "reward_filter": self._reward_filter,
            "random": self._random,
            **{name: optimizer for name, optimizer in (
                ("policy_optimizer", self._policy_optimizer),
                ("value_optimizer", self._value_optimizer)) if optimizer is not None},
        }

    @property
    def progress_state(self):
        """Trackables of the training in progress that `checkpoint_state` leaves out: the
        episodes in progress and the memory, the recurrent states, the stored policy
        parameters and the discounted returns. With them a restored algorithm continues
        exactly (`batchrl.Agent.save`); the Loop does without (every phase begins new
        episodes)."""
        return {
            **({} if self._episodes is None else {"episodes": self._episodes}),
            "memory": self._memory,
            "memory_final": self._memory_final,
            "memory_terminated": self._memory_terminated,
            "memory_index": self._memory_index,
            "episode_final": self._episode_final,
            "episode_terminated": self._episode_terminated,
            **self._acting.agent_variables,
            "discounted_return": self._return,
        }

    @property
    def state_size(self):
        """int, the size of the policy's recurrent state (0 for a feed-forward policy)."""
        return self._state_size

    def policy_action(self, observ, state, generator=None):
        """The policy's action for raw observations, changing no variable: for acting
        outside of training and for exported models.

        Args:
          observ: float32 `[n, *observation_shape]`, raw (unnormalized) observations.
          state: float32 `[n, state_size]`, the recurrent states (`[n, 0]` for a
            feed-forward policy).
          generator: a `tf.random.Generator` to sample the action with; None: the mode
            (mean) action.

        Returns:
          `(action, state)`: `[n, *action_shape]` and the next recurrent states.
        """
        action, state, _ = self._acting.step_policy(
            observ, state, generator is not None, generator)
        return action, state

    def _normalized(self, observ):
        """Observations as the networks and the memory take them
        (`OnPolicyActor.normalized`)."""
        return self._acting.normalized(observ)

    def begin_episodes(self, agent_indices):
        """Empties the current episode and zeroes the recurrent state of the given agents
        (int32 `[n]`); with `rollout_length`, marks the last stored step of their rollouts
        as the end of an episode (`RolloutMemory.cut`), as the episode in progress there is
        cut short when a phase begins new episodes."""
        cleared = [self._memory.cut(agent_indices) if self._rollout_length
                   else self._episodes.clear(agent_indices),
                   zero_returns(self._return, agent_indices),
                   self._acting.begin_episodes(agent_indices)]
        return after(cleared, True)

    def perform(self, agent_indices, observ):
        """Actions for the given agents: sampled while training, the mode otherwise.

        Args:
          agent_indices: int32 `[n]`.
          observ: float32 `[n, *observation_shape]`, raw observations.

        Returns:
          actions `[n, *action_shape]`.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        with tf.name_scope("perform"):
            return self._acting.perform(agent_indices, observ, self._is_training)

    def experience(self, agent_indices, observ, action, reward, done, nextob):
        """Records a transition of the given agents while training.

        Args:
          agent_indices: int32 `[n]`.
          observ: float32 `[n, *observation_shape]`, the observation the action was taken in.
          action: `[n, *action_shape]`.
          reward: float32 `[n]`.
          done: bool `[n]`, the step ended the episode (stored with `rollout_length`;
            terminal states are read from the environment).
          nextob: float32 `[n, *observation_shape]`, the observation after the step.
        """
        return self._while_training(
            self._record, agent_indices, observ, action, reward, done, nextob)

    def _record(self, agent_indices, observ, action, reward, done, nextob):
        with tf.name_scope("experience"):
            agent_indices = tf.cast(agent_indices, tf.int32)
            normalized = self._normalized(observ)
            normalized_next = self._normalized(nextob)
            rows = agent_indices[:, None]
            with tf.control_dependencies([normalized, normalized_next]):
                statistics = [self._reward_filter.update(self._reward_statistic(rows, reward))]
                if not self._raw_observ:
                    statistics.append(self._observ_filter.update(observ))
            transition = {**self._observ_storage.encode("observ", normalized),
                          "action": action, "reward": reward,
                          **self._acting.acted(agent_indices)}
            terminated = tf.gather(self._batch_env.terminated, agent_indices)
            if self._rollout_length:
                transition.update(self._observ_storage.encode("next_observ", normalized_next),
                                  done=done, terminated=terminated)
                with tf.control_dependencies(statistics):
                    stored = self._memory.append(transition, agent_indices)
                with tf.control_dependencies([stored]):
                    full = self._memory.full(self._rollout_length)
                    return tf.cond(full, self._train, lambda: tf.constant(False))
            stored = [
                self._episodes.append(transition, agent_indices),
                self._episode_final.scatter_nd_update(rows, normalized_next),
                self._episode_terminated.scatter_nd_update(rows, terminated),
            ]
            return after(statistics + stored, True)

    def _reward_statistic(self, rows, reward):
        """What the reward normalizer's standard deviation is taken of: the rewards, or
        the agents' discounted returns so far (updated here)."""
        if self._config.reward_normalizer == "reward":
            return reward
        return running_return(self._return, rows[:, 0], reward, self._config.discount)

    def end_episodes(self, agent_indices):
        """Moves the finished episodes of the given agents into the memory while training,
        and trains once the memory holds `update_every` episodes; with `rollout_length`,
        does nothing (`experience` stores the steps, and trains once the first agent's row
        holds `rollout_length` of them, the others with as many as they have)."""
        if self._rollout_length:
            return tf.constant(False)
        return self._while_training(self._store, agent_indices)

    def _store(self, agent_indices):
        with tf.name_scope("end_episodes"):
            agent_indices = tf.cast(agent_indices, tf.int32)
            free = self._config.update_every - self._memory_index
            # The first `free` indices, by a mask rather than `agent_indices[:free]`: XLA
            # (whole-call `jit_compile`) takes a slice's end as a compile-time constant,
            # compiling the call again for every value of `_memory_index` at its start, and
            # where it cannot (inside the step loop) slices `free` elements even past the
            # end of the input, padded with zeros, which filled the memory too early.
            used = tf.boolean_mask(
                agent_indices, tf.range(tf.shape(agent_indices)[0]) < free)
            rows = self._memory_index + tf.range(tf.shape(used)[0])
            episodes, length = self._episodes.data(used)
            stored = [
                self._memory.replace(episodes, length, rows),
                self._memory_final.scatter_nd_update(
                    rows[:, None], tf.gather(self._episode_final, used)),
                self._memory_terminated.scatter_nd_update(
                    rows[:, None], tf.gather(self._episode_terminated, used)),
            ]
            with tf.control_dependencies(stored):
                count = self._memory_index.assign_add(tf.shape(used)[0])
            return tf.cond(count >= self._config.update_every, self._train,
                           lambda: tf.constant(False))

    def _train(self):
        """The update on the full memory (`_update`, which empties it) and its summaries
        under `NAME/`: a scalar of each float32 scalar it returns, a histogram of each entry
        named in `histograms` over the valid steps (its `mask`), and the normalizers'
        statistics; returns True once done."""
        with tf.name_scope("update"):
            return after(self._update_summaries(self._update(), self._should_log), True)

    def _update_summaries(self, result, record):
        """Writes the summaries of an update's `result` (`update`'s dict) while `record`
        (bool scalar tensor), as `_train` describes; returns the summary ops."""
        result = dict(result)
        mask = result.pop("mask")
        histograms = {key: result.pop(key) for key in self.histograms if key in result}
        return self._write_summaries(
            result, record, lambda: [
                summaries_lib.histogram(
                    name, tf.cast(tf.boolean_mask(value, mask > 0), tf.float32))
                for name, value in histograms.items()],
            (self._observ_filter, self._reward_filter))

    def compile_ahead(self):
        """With `jit_update`, runs the compiled update once on the memory as it is (empty
        before training: no valid step, no optimizer step) so that XLA compiles it, and
        sets every variable back (`_undone`). It runs inside a graph function, as in the
        step function: called eagerly, the update is traced anew and XLA compiles another
        program, which the step function does not reuse (measured: two entries in the
        compilation cache instead of one)."""
        if self._jit_update:
            self._undone(tf.function(lambda: self._update(), autograph=False))

    def _memory_update(self):
        """The update on the memory, free of summaries so that XLA can compile it: the
        learning rates scheduled (`_schedule_learning_rates`), the memory read as a batch
        (`_memory_batch`), `update(batch)`, and the memory emptied once its results are
        computed; returns those results (`tf.identity`, after the memory is emptied)."""
        with tf.control_dependencies(self._schedule_learning_rates()):
            batch = self._memory_batch()
        results = self.update(batch)
        with tf.control_dependencies(list(results.values())):
            cleared = [self._memory.clear(), self._memory_index.assign(0)]
        with tf.control_dependencies(cleared):
            return {key: tf.identity(value) for key, value in results.items()}

    def _memory_batch(self):
        """The memory's `E = update_every` episodes, padded to `T = memory_length` steps, as
        a dict of tensors: `observ` float32 `[E, T, *observation_shape]` (normalized);
        `action` `[E, T, *action_shape]`; `mask` float32 `[E, T]`, 1 for valid steps;
        `length` int32 `[E]`; `reward` float32 `[E, T]`, scaled by the reward normalizer
        and 0 beyond each episode's length; `value` float32 `[E, T]`, V(s_t)
        (`_recorded_value`), 0 beyond the length; `bootstrap` float32 `[E]`, the value of
        the observation after the last step, 0 when the episode terminated;
        `policy_<param>` `[E, T, ...]`, the parameters of the policy that acted; and, for a
        recurrent policy, `state` float32 `[E, T, state_size]`, the state each step was
        acted on."""
        episodes, length = self._memory.data()
        observ = self._observ_storage.decode("observ", episodes)
        if self._rollout_length:
            return self._rollout_batch(
                episodes, observ, self._observ_storage.decode("next_observ", episodes),
                length)
        mask = advantage_lib.sequence_mask(length, self._memory_length)
        batch = self._recorded_batch(episodes, observ, mask, length)
        not_terminal = 1.0 - tf.cast(self._memory_terminated, tf.float32)
        batch["bootstrap"] = (self._value(self._memory_final[:, None])[:, 0] * not_terminal)
        return batch

    def _rollout_batch(self, rows, observ, next_observ, length):
        """The batch of `_memory_batch` for rows of `rollout_length` consecutive steps,
        from this process's memory or from an actor's fragment (`IMPALA.learn`): `rows`
        holds `action`, raw `reward`, `done`, `terminated`, the `policy_<param>` of the
        policy that acted and for a recurrent policy `state`, `[rows, T, ...]`; `observ` and
        `next_observ` normalized `[rows, T, *observation_shape]`; `length` int32 `[rows]`.
        Adds `next_value` (`_next_value`), `done` and `terminated` to `_recorded_batch`'s
        keys."""
        time = rows["reward"].shape[1]  # Static where known (this process's memory).
        mask = advantage_lib.sequence_mask(
            length, tf.shape(rows["reward"])[1] if time is None else time)
        batch = self._recorded_batch(rows, observ, mask, length)
        batch.update(next_value=advantage_lib.masked(self._next_value(
            batch["value"], next_observ, rows["done"], length), mask),
            done=rows["done"], terminated=rows["terminated"])
        return batch

    def _recorded_batch(self, rows, observ, mask, length):
        """The keys of `_memory_batch` that every recording gives: `observ` (normalized),
        `action`, `mask`, `length`, `reward` (normalized, masked), `value` (masked), the
        `policy_<param>` and, for a recurrent policy, `state`, from `rows` (dict of
        `[rows, T, ...]`)."""
        batch = {
            "observ": observ, "action": rows["action"], "mask": mask, "length": length,
            "reward": advantage_lib.masked(self._reward_filter.transform(rows["reward"]),
                                           mask),
            "value": advantage_lib.masked(self._recorded_value(rows, observ), mask),
        }
        for key in self._param_shapes:
            batch["policy_" + key] = rows["policy_" + key]
        if self._recurrent:
            batch["state"] = rows["state"]
        return batch

    def _recorded_value(self, rows, observ):
        """V(s_t) of recorded steps, float32 `[rows, time]`: the value network now on
        `observ` (`_value`). `rows`: the recording's dict of `[rows, time, ...]`."""
        return self._value(observ)

    def _value(self, observ):
        """The value network's estimate of the return, float32 `[batch, time]` for
        observations `[batch, time, *observation_shape]`."""
        return self._networks.value(observ)

    def _next_value(self, value, next_observ, done, length):
        """V(s_{t+1}) of rows of consecutive steps (`rollout_length`), float32
        `[rows, time]`: `value` (V(s_t) `[rows, time]`) one step on where the row's episode
        goes on (the observation after a step is the next step's), and the value network
        on `next_observ` (`[rows, time, *observation_shape]`) only at the steps where it
        does not (`done` bool `[rows, time]`: the final observation; the last of a row's
        `length` int32 `[rows]` steps). For images this halves the value network's passes.
        Beyond a row's length, the value is undefined (mask it)."""
        time = tf.shape(value)[1]
        last = tf.one_hot(length - 1, time, on_value=True, off_value=False, dtype=tf.bool)
        valid = tf.sequence_mask(length, time)
        ends = tf.where(tf.logical_and(tf.logical_or(done, last), valid))
        end_value = self._value(tf.gather_nd(next_observ, ends)[None])[0]
        following = tf.concat([value[:, 1:], tf.zeros_like(value[:, :1])], 1)
        return tf.tensor_scatter_nd_update(following, ends, end_value)

    def _build_optimizers(self, policy_optimizer, value_optimizer):
        """Keeps the optimizers of the policy's and of the value network's trainable
        variables as `_policy_optimizer` and `_value_optimizer`, builds them for those
        variables, and adds them to `checkpoint_state`. With `value_optimizer` None, the
        policy's optimizer is built for the variables of both (`_joint_variables`)."""
        self._policy_optimizer = policy_optimizer
        self._value_optimizer = value_optimizer
        if value_optimizer is None:
            policy_optimizer.build(self._joint_variables())
            return
        policy_optimizer.build(self._networks.policy.trainable_variables)
        value_optimizer.build(self._networks.value.trainable_variables)

    def _joint_variables(self):
        """The trainable variables of the policy and the value network, each once (those
        of a shared torso are in both)."""
        variables = {}
        for variable in (self._networks.policy.trainable_variables
                         + self._networks.value.trainable_variables):
            variables.setdefault(id(variable), variable)
        return list(variables.values())

    def _remaining(self):
        """float32 scalar: the fraction of the run's `steps` still to train, in [0, 1]."""
        done = tf.cast(self._step, tf.float32) / float(self._config.steps)
        return tf.maximum(1.0 - done, 0.0)

    def _schedule_learning_rates(self):
        """With `lr_schedule: linear`, scales the optimizers' learning rates by the fraction
        of the run's `steps` still to train (as in Schulman et al., arXiv:1707.06347, table
        3, for MuJoCo; 0 from `steps` on: the policy stops changing); returns the
        assignments (none for other schedules, or a subclass without `lr_schedule`)."""
        if "lr_schedule" not in self.config_keys or self._config.lr_schedule != "linear":
            return []
        return self._scale_learning_rates(self._remaining())

    def _scale_learning_rates(self, scale):
        """Sets the optimizers' learning rates to their configured values times `scale`
        (float32 scalar); returns the assignments. Here for `batchrl.optimizers`
        optimizers (`scale_learning_rate`); a subclass with others overrides it."""
        return (self._policy_optimizer.scale_learning_rate(scale)
                + self._value_optimizer.scale_learning_rate(scale))

    def _replay(self, observ):
        """The current policy's parameters on a batch's rows of observations `[rows, time,
        ...]`, each replayed from the zero state; dict of `[rows, time, ...]`."""
        params, _ = self._networks.policy(
            observ, tf.zeros([tf.shape(observ)[0], self._state_size]))
        return params
