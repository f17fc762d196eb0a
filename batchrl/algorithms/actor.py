"""The acting half of an algorithm: its policy network, observation filter and exploration,
buildable alone (without optimizers or memories) and copied as a list of arrays, so that an
actor process can hold a copy of a learner's policy and receive its newer versions."""

import abc

import tensorflow as tf

from batchrl.algorithms import exploration as exploration_lib
from batchrl.algorithms.base import observation_filter
from batchrl.networks.constructors import Networks
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
        """The variables of `get_weights`: the policy's, then the observation filter's."""

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
    not normalized stay in their own dtype (`raw_observ`)."""

    def __init__(self, observation_space, action_space, config, generator=None, step=None,
                 observ_shape=None, observ_dtype=None):
        super().__init__(observation_space, action_space, config, generator, step,
                         observ_shape, observ_dtype)
        networks = config.network(observation_space, action_space, config)
        # One type for both families, whatever a user's constructor returns.
        self.networks = Networks(networks.policy, networks.value, networks.distribution)
        self.raw_observ = not (config.normalize_observ or self.observ_dtype.is_floating)
        self.observ_filter = observation_filter(observation_space, self.observ_shape, config)

    @property
    def variables(self):
        return list(self.networks.policy.variables) + list(self.observ_filter.variables)

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


class OffPolicyActor(Actor):
    """The acting half of the off-policy algorithms: the policy model (`build_policy`), the
    observation filter and the config's `exploration` (None: the algorithm's default),
    which keeps a noise state for each of `num_agents` agents (None: `config.num_agents`);
    `action_shape` (None: the action space's) is the shape of one action. The policy
    model is built at once, or with `defer_policy` (an algorithm's, which builds its models
    in its own order) by `build_policy`.
    A subclass gives the model and its actions on normalized observations: `greedy`,
    `explore` (before the exploration) and `sampled` (the exported `sample` action)."""

    default_exploration = None
    discrete = False

    def __init__(self, observation_space, action_space, config, generator=None, step=None,
                 observ_shape=None, observ_dtype=None, num_agents=None, action_shape=None,
                 defer_policy=False):
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
        self.policy = None
        if not defer_policy:  # An algorithm builds it in its own order (`build_policy`).
            self.build_policy()
            self.policy(tf.zeros((1,) + self.observ_shape))  # Its weights exist.

    def build_policy(self):
        """Builds the policy model (`make_policy`) and returns it."""
        self.policy = self.make_policy()
        return self.policy

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
        return list(self.policy.variables) + list(self.observ_filter.variables)

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
