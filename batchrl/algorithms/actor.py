"""The acting half of an algorithm: its policy network, observation filter and exploration,
buildable alone (without optimizers or memories) and copied as a list of arrays, so that an
actor process can hold a copy of a learner's policy and receive its newer versions."""

import abc

import tensorflow as tf

from batchrl.algorithms import exploration as exploration_lib
from batchrl.algorithms.base import checked, observation_filter
from batchrl.networks.constructors import Networks
from batchrl.tools.graph import after
from batchrl.tools.weights import VariableCopier


class Actor(abc.ABC):
    """What acts: the policy network(s), the observation filter and the exploration.

    Built as `ActorClass(observation_space, action_space, config)` from the spaces of the
    (in-graph) batch environment and the algorithm's config (the same config the
    algorithm is built with); an algorithm builds its own with its generator and step
    (`generator`, `step`) and acts through it.

    Args:
      observation_space, action_space: the batch environment's spaces (one agent's).
      config: the algorithm's config (`normalize_observ`, `observ_clip`, optional
        `normalize_keys`, `seed`, and what the family's networks read).
      generator: the `tf.random.Generator` that explored actions are drawn with (None:
        one of its own, seeded with `config.seed`).
      step: int64 scalar variable, the environment steps trained so far, for exploration
        schedules (None: one of its own, 0; set it to the learner's).
      observ_shape, observ_dtype: the shape and dtype of one observation as the batch
        environment gives it (None: those of `observation_space`).
    """

    def __init__(self, observation_space, action_space, config, generator=None, step=None,
                 observ_shape=None, observ_dtype=None):
        self.observation_space = observation_space
        self.action_space = action_space
        self._config = config
        self.observ_shape = tuple(observation_space.shape if observ_shape is None
                                  else observ_shape)
        self.observ_dtype = tf.as_dtype(observation_space.dtype if observ_dtype is None
                                        else observ_dtype)
        self.generator = (tf.random.Generator.from_seed(config.seed) if generator is None
                          else generator)
        self.step = (tf.Variable(0, dtype=tf.int64, trainable=False, name="actor_step")
                     if step is None else step)
        self._weights = None  # `_copier`'s.

    @abc.abstractmethod
    def act(self, observ, state, explore):
        """Actions for raw observations `[n, *observation_shape]` and recurrent states
        float32 `[n, state_size]` (`[n, 0]` for a feed-forward policy): explored when
        `explore` (a Python bool or a bool scalar tensor), deterministic otherwise.
        Returns `(action, state)`: `[n, *action_shape]` and the next states."""

    @property
    @abc.abstractmethod
    def variables(self):
        """The variables of `get_weights`: the policy's, then the observation filter's (and
        an off-policy acting half's critic's and the step, with its critic)."""

    def get_weights(self):
        """The policy's weights and the normalizer's statistics: list of np.ndarray, in the
        order of `variables` (read in one compiled call: `VariableCopier`)."""
        return self._copier().get()

    def set_weights(self, arrays):
        """Sets the weights that `get_weights` of an actor of the same config returned.

        Raises:
          ValueError: a different number of arrays, or an array of another shape.
        """
        self._copier().set(arrays)

    def _copier(self):
        """The `VariableCopier` of `variables`, made at the first call (the policy exists
        by then)."""
        if self._weights is None:
            self._weights = VariableCopier(self.variables)
        return self._weights


class OnPolicyActor(Actor):
    """The acting half of the on-policy algorithms: the networks of the config's `network`
    constructor (whose `policy` acts; the constructors build the value network with it),
    and the observation filter; explored actions are sampled from the policy's
    distribution, deterministic ones are its mode. Observations that are not floats and
    not normalized stay in their own dtype (`raw_observ`).

    With `num_agents` (int), it also keeps what acting a batch of that many agents needs
    from step to step, and what a recording stores of each step: each agent's recurrent
    state (zeroed by `begin_episodes`, advanced by `perform`), and the state and the
    distribution's parameters its last action was taken with (`acted`). The same code acts
    in one process (`OnPolicyAlgorithm`) and in an actor (`FragmentRecorder`).

    Attributes:
      state_size: int, the size of the policy's recurrent state (0: feed-forward).
      param_shapes: dict of str to tuple, the shape of each of the distribution's
        parameters for one step (e.g. `mean` and `logstd` `(action_dim,)`).
      num_agents: int or None, the agents it keeps acting state for.
    """

    def __init__(self, observation_space, action_space, config, generator=None, step=None,
                 observ_shape=None, observ_dtype=None, num_agents=None):
        super().__init__(observation_space, action_space, config, generator, step,
                         observ_shape, observ_dtype)
        networks = config.network(observation_space, action_space, config)
        # One type for both families, whatever a user's constructor returns.
        self.networks = Networks(networks.policy, networks.value, networks.distribution)
        self.raw_observ = not (config.normalize_observ or self.observ_dtype.is_floating)
        self.observ_filter = observation_filter(observation_space, self.observ_shape, config)
        self.state_size = int(self.networks.policy.state_size)
        params, _ = self.networks.policy(
            tf.zeros((1, 1) + self.observ_shape), tf.zeros((1, self.state_size)))
        self.param_shapes = {key: tuple(value.shape[2:]) for key, value in params.items()}
        self.num_agents = None if num_agents is None else int(num_agents)
        self._agent_state = None
        if num_agents is not None:
            zeros = tf.zeros((int(num_agents), self.state_size))
            # Each agent's recurrent state, and the one its last action was taken in.
            self._agent_state = tf.Variable(zeros, trainable=False, name="state")
            self._acted_state = tf.Variable(zeros, trainable=False, name="last_state")
            self._acted_params = {
                key: tf.Variable(tf.zeros((int(num_agents),) + shape), trainable=False,
                                 name="last_" + key)
                for key, shape in self.param_shapes.items()}

    @property
    def variables(self):
        return list(self.networks.policy.variables) + list(self.observ_filter.variables)

    @property
    def acting_specs(self):
        """What `acted` gives of one step: dict of `(shape, dtype)`, `policy_<param>` for
        each parameter, and `state` for a recurrent policy (a recording's template)."""
        specs = {"policy_" + key: (shape, tf.float32) for key, shape in self.param_shapes.items()}
        if self.state_size:
            specs["state"] = ((self.state_size,), tf.float32)
        return specs

    @property
    def agent_variables(self):
        """The per-agent acting variables (with `num_agents`), for a checkpoint of the
        training in progress: `state`, `last_state` and `last_params` (a dict)."""
        return {"state": self._agent_state, "last_state": self._acted_state,
                "last_params": dict(self._acted_params)}

    def normalized(self, observ):
        """Observations as the networks and the memory take them: normalized float32, or
        raw observations in their own dtype (`raw_observ`)."""
        return observ if self.raw_observ else self.observ_filter.transform(observ)

    def step_policy(self, observ, state, explore, generator=None):
        """`(action, state, params)`: `act`'s, and the policy's parameters (dict of
        `[n, ...]`) the action was drawn from; a sampled action is drawn with `generator`
        (None: the actor's)."""
        params, state = self.networks.policy(self.normalized(observ)[:, None], state)
        params = {key: value[:, 0] for key, value in params.items()}
        distribution = self.networks.distribution(params)
        generator = self.generator if generator is None else generator
        if isinstance(explore, bool):
            action = distribution.sample(generator) if explore else distribution.mode()
        else:
            action = tf.cond(tf.convert_to_tensor(explore),
                             lambda: distribution.sample(generator), distribution.mode)
        return action, state, params

    def act(self, observ, state, explore):
        action, state, _ = self.step_policy(observ, state, explore)
        return action, state

    def begin_episodes(self, agent_indices):
        """Zeroes the recurrent state of the given agents (int32 `[n]`); returns the op
        (a constant for a feed-forward policy)."""
        if not self.state_size:
            return tf.constant(True)
        rows = tf.cast(agent_indices, tf.int32)[:, None]
        return self._agent_state.scatter_nd_update(
            rows, tf.zeros([tf.shape(rows)[0], self.state_size]))

    def perform(self, agent_indices, observ, explore):
        """The actions of the given agents (int32 `[n]`) for raw observations
        `[n, *observation_shape]`: sampled when `explore` (a Python bool or a bool scalar
        tensor), the mode otherwise; keeps the parameters they were drawn from and the
        state they were taken in (`acted`), and advances the agents' states.

        Returns:
          `[n, *action_shape]`, once the variables are written.

        Raises:
          tf.errors.InvalidArgumentError (when run): if an action is NaN or infinite.
        """
        agent_indices = tf.cast(agent_indices, tf.int32)
        state = tf.gather(self._agent_state, agent_indices)
        action, new_state, params = self.step_policy(observ, state, explore)
        action = checked(action)
        rows = agent_indices[:, None]
        stored = [self._acted_params[key].scatter_nd_update(rows, params[key])
                  for key in self.param_shapes]
        if self.state_size:
            stored.append(self._acted_state.scatter_nd_update(rows, state))
            with tf.control_dependencies(stored):
                stored.append(self._agent_state.scatter_nd_update(rows, new_state))
        return after(stored, action)

    def acted(self, agent_indices):
        """What a recording stores of the given agents' (int32 `[n]`) last `perform`:
        dict of `acting_specs`' keys, `[n, ...]`."""
        agent_indices = tf.cast(agent_indices, tf.int32)
        acted = {"policy_" + key: tf.gather(self._acted_params[key], agent_indices)
                 for key in self.param_shapes}
        if self.state_size:
            acted["state"] = tf.gather(self._acted_state, agent_indices)
        return acted


class OffPolicyActor(Actor):
    """The acting half of the off-policy algorithms: the policy model (`build_policy`), the
    observation filter and the config's `exploration` (None: the algorithm's default),
    which keeps a noise state for each of `num_agents` agents (None: `config.num_agents`);
    `action_shape` (None: the action space's) is the shape of one action. The policy
    model is built at once, or with `defer_policy` (an algorithm's, which builds its models
    in its own order) by `build_policy`.
    A subclass gives the model and its actions on normalized observations: `greedy`,
    `explore` (before the exploration) and `sampled` (the exported `sample` action), and
    its algorithm's `critic_class` (`batchrl.algorithms.critic.Critic`).

    With `critic` (an Ape-X actor's), it also builds the critic at once, after the policy,
    and gives its transitions' TD errors (`critic.td_error`); an algorithm builds its own
    critic (`build_critic`). With a critic, `variables` (what `get_weights` copies) are
    the policy's, the observation filter's, the critic's and the step: what an Ape-X actor
    acts, explores and gives first priorities with."""

    default_exploration = None
    discrete = False
    critic_class = None

    def __init__(self, observation_space, action_space, config, generator=None, step=None,
                 observ_shape=None, observ_dtype=None, num_agents=None, action_shape=None,
                 defer_policy=False, critic=False):
        super().__init__(observation_space, action_space, config, generator, step,
                         observ_shape, observ_dtype)
        self.observ_filter = observation_filter(observation_space, self.observ_shape, config)
        self.action_shape = tuple(action_space.shape if action_shape is None
                                  else action_shape)
        spec = config.exploration if config.exploration is not None else (
            self.default_exploration)
        self.exploration = exploration_lib.Exploration(
            exploration_lib.parse(spec, self.discrete),
            int(config.num_agents if num_agents is None else num_agents), self.action_shape,
            int(action_space.n) if self.discrete else None)
        self.policy = self.critic = None
        if not defer_policy:  # An algorithm builds it in its own order (`build_policy`).
            self.build_policy()
            self.policy(tf.zeros((1,) + self.observ_shape))  # Its weights exist.
            if critic:
                self.build_critic()

    def build_policy(self):
        """Builds the policy model (`make_policy`) and returns it."""
        self.policy = self.make_policy()
        return self.policy

    def build_critic(self):
        """Builds the critic (`critic_class`) for this acting half, keeps it as `critic`
        and returns it."""
        self.critic = self.critic_class(self, self._config)
        return self.critic

    @abc.abstractmethod
    def make_policy(self):
        """A new policy model, built."""

    @abc.abstractmethod
    def greedy(self, observ):
        """The deterministic action for normalized observations `[n, ...]`."""

    def explore(self, observ):
        """The training action before the exploration, for normalized observations."""
        return self.greedy(observ)

    def sampled(self, observ, generator):
        """The exported `sample` action (drawn with `generator`); default: `greedy`."""
        del generator
        return self.greedy(observ)

    def exploration_kwargs(self, observ):
        """Keyword arguments of the exploration for these (normalized) observations."""
        del observ
        return {}

    @property
    def variables(self):
        variables = list(self.policy.variables) + list(self.observ_filter.variables)
        if self.critic is not None:
            variables += self.critic.variables + [self.step]
        return variables

    def act(self, observ, state, explore, agent_indices=None):
        """As `Actor.act`; the exploration's noise state is that of the agents
        `agent_indices` (int32 `[n]`; None: 0 to n - 1)."""
        normalized = self.observ_filter.transform(observ)
        return self.choose(normalized, explore, agent_indices, lambda: self.explore(normalized),
                           lambda: self.greedy(normalized)), state

    def choose(self, normalized, explore, agent_indices, proposed, greedy):
        """The action of `act` for normalized observations `[n, ...]`: the exploration
        (agents `agent_indices`, None: 0 to n - 1) applied to `proposed()` when `explore`
        (a Python bool or a bool scalar tensor), else `greedy()`; both zero-argument
        callables returning `[n, *action_shape]` (only the one chosen runs)."""
        if agent_indices is None:
            agent_indices = tf.range(tf.shape(normalized)[0])

        def explored():
            return self.exploration(agent_indices, proposed(), self.step, self.generator,
                                    **self.exploration_kwargs(normalized))

        if isinstance(explore, bool):
            return explored() if explore else greedy()
        return tf.cond(tf.convert_to_tensor(explore), explored, greedy)
