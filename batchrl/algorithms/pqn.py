"""PQN: Q-learning on the rollouts of a batch of environments, with neither a replay memory
nor a target network.

Gallici, Fellows, Ellis, Pou, Masmitja, Foerster, Martin, "Simplifying Deep Temporal
Difference Learning", ICLR 2025, arXiv:2407.04811, algorithm 1: epsilon-greedy actions of
the Q network on many environments at once; once every agent took `rollout_length` steps,
Q(lambda) targets computed once by a backward recursion over max_a Q(s', a); then a few
epochs of minibatches of the squared TD error on the shuffled steps. Normalizing each hidden
layer (a declared `layer_norm` after each dense layer) is what the paper shows keeps it
stable without a target network (section 4).

It is composed of the parts every on-policy algorithm has: the acting half (`PQNActor`:
the Q network acts epsilon-greedily, as a distribution over actions, so that the same
code acts in one process and in an actor), the rollout recording (`rollout_length`; an
actor's fragments), and `update(batch)`.
"""

import gymnasium as gym
import keras
import tensorflow as tf

from batchrl import optimizers
from batchrl.algorithms import advantage as advantage_lib
from batchrl.algorithms import exploration as exploration_lib
from batchrl.algorithms import parts
from batchrl.algorithms.actor import OnPolicyActor
from batchrl.algorithms.on_policy import OnPolicyAlgorithm
from batchrl.errors import ConfigError
from batchrl.networks.built_by_call import BuiltByCall
from batchrl.networks.constructors import Networks

# A forbidden action's Q value (the action mask's, and for a MultiDiscrete choice the
# actions it lacks, `batchrl.networks.policies`): never greedy, never drawn, never a max.
_FORBIDDEN = -1e8


def q_lambda_returns(reward, value, next_value, terminated, done, length, discount,
                     q_lambda):
    """The Q(lambda) targets of rollouts: lambda-returns of V(s) = max_a Q(s, a).

    Gallici et al. 2025 (arXiv:2407.04811), section 4.2 and algorithm 1, after Peng and
    Williams, "Incremental Multi-Step Q-Learning", 1996: backwards along each row,
    `G_t = r_t + discount * (1 - terminated_t) * ((1 - lambda_t) V(s'_t) + lambda_t G_{t+1})`,
    where `V(s'_t) = max_a Q(s'_t, a)` is the value of the observation after step t and
    `lambda_t` is `q_lambda` inside an episode and 0 where the episode ends (`done`: a
    truncated episode bootstraps from its final observation's value, a terminated one
    from nothing) and at a row's last valid step (bootstrapping from the next row's first
    observation). These are GAE(lambda)'s value targets with V = max_a Q
    (`advantage.rollout_advantage`: `A_t + V(s_t)` unrolls to the same recursion).

    Args:
      reward, value, next_value: float32 `[rows, time]`: r_t, max_a Q(s_t, a) and
        max_a Q(s'_t, a).
      terminated, done: bool `[rows, time]`, step t ended its episode in a terminal state
        / at all (terminated, truncated or cut short).
      length: int32 `[rows]`, the valid steps of each row; later steps are ignored.
      discount, q_lambda: floats in [0, 1].

    Returns:
      float32 `[rows, time]`, zero beyond each row's length.
    """
    _, target = advantage_lib.rollout_advantage(
        reward, value, next_value, terminated, done, length, discount, q_lambda)
    return target


class EpsilonGreedy:
    """Epsilon-greedy over action values, as an action distribution: `sample` draws an
    allowed action uniformly with probability `epsilon`, else the greedy one; `mode` is the
    greedy action.

    Args:
      params: dict of one entry, float32 Q values `[..., n]` (a `Discrete` space) or
        `[..., k, n]` (a `MultiDiscrete` space of `k` choices; each choice is explored on
        its own); an action the observation's mask forbids, or that a choice lacks, has a
        Q value below -1e8 (the categorical heads' -1e9).
      epsilon: float32 scalar.
      dtype: of the actions, `[...]` or `[..., k]` indices (int32; float32 for the flat
        actions of a `MultiDiscrete` space, `batchrl.spaces.nested.FlatActionSpace`).
    """

    def __init__(self, params, epsilon, dtype=tf.int32):
        (self.q,) = params.values()
        self.epsilon = epsilon
        self._dtype = dtype

    def mode(self):
        """The greedy action."""
        return tf.cast(self._greedy(), self._dtype)

    def sample(self, generator):
        """An epsilon-greedy action, drawn with a `tf.random.Generator`."""
        return tf.cast(exploration_lib.epsilon_greedy(
            self._greedy(), self.epsilon, generator, self.q > _FORBIDDEN), self._dtype)

    def _greedy(self):
        return tf.argmax(self.q, -1, output_type=tf.int32)


class MaxQ(BuiltByCall, keras.layers.Layer):
    """V(s) = max_a Q(s, a) of a feed-forward Q network (`[batch, time, ...]` observations
    to float32 `[batch, time]`); for a `MultiDiscrete` space the mean over its choices of
    each choice's maximum (Tavakoli, Pardo, Kormushev, "Action Branching Architectures for
    Deep Reinforcement Learning", AAAI 2018, eq. 6). Holds no variables of its own."""

    def __init__(self, q_network, choices):
        super().__init__(name="max_q")
        self.q_network = q_network
        self._choices = choices

    def call(self, observ):
        return max_q(q_values(self.q_network, observ), self._choices)


def q_values(q_network, observ):
    """Q(s, .) of a feed-forward Q network for observations `[batch, time, ...]`."""
    params, _ = q_network(observ, tf.zeros([tf.shape(observ)[0], 0]))
    (q,) = params.values()
    return q


def max_q(q, choices):
    """`MaxQ`'s value of Q values `[..., n]` (`[..., k, n]` with `choices`)."""
    value = tf.reduce_max(q, -1)
    return tf.reduce_mean(value, -1) if choices else value


class PQNActor(OnPolicyActor):
    """PQN's acting half: the config's network's policy is the Q network (its logits the Q
    values of a `Discrete` or `MultiDiscrete` space), acting epsilon-greedily while
    exploring (`EpsilonGreedy`, epsilon of the config's `exploration`, an
    `epsilon_decay` over the training steps) and greedily otherwise; its value network is
    `MaxQ` of it. The step (of the schedule) travels with its weights to an actor.

    Raises:
      ConfigError: an action space other than `Discrete` or `MultiDiscrete`, an
        `exploration` other than `epsilon_decay`, or a recurrent network.
    """

    def __init__(self, observation_space, action_space, config, *args, **kwargs):
        leaves = getattr(action_space, "leaves", ())  # A `FlatActionSpace`'s.
        if not (isinstance(action_space, gym.spaces.Discrete) or (
                len(leaves) == 1 and isinstance(leaves[0].space, gym.spaces.MultiDiscrete))):
            raise ConfigError(f"pqn learns the Q values of a Discrete or MultiDiscrete "
                              f"action space, not {getattr(action_space, 'space', action_space)}")
        # A MultiDiscrete space's actions are the float32 indices of its flat actions.
        self._action_dtype = tf.int32 if not leaves else tf.float32
        super().__init__(observation_space, action_space, config, *args, **kwargs)
        if self.state_size:
            raise ConfigError("pqn learns a feed-forward Q network; the network is recurrent")
        self.exploration = exploration_spec(config)
        q_network = self.networks.policy
        choices = len(next(iter(self.param_shapes.values()))) == 2
        self.networks = Networks(q_network, MaxQ(q_network, choices), self._distribution)
        self.choices = choices

    def epsilon(self):
        """float32 scalar, the exploration rate at the current step."""
        return exploration_lib.epsilon(self.exploration, self.step)

    def _distribution(self, params):
        return EpsilonGreedy(params, self.epsilon(), self._action_dtype)

    @property
    def variables(self):
        return super().variables + [self.step]


def exploration_spec(config):
    """The `epsilon_decay` spec of the config's `exploration`; null: from 1 to 0.05 over
    the first tenth of `steps` (Gallici et al. 2025, appendix: their settings).

    Raises:
      ConfigError: a spec that is wrong, or of another type.
    """
    spec = config.exploration or {"type": "epsilon_decay", "initial": 1.0, "final": 0.05,
                                  "steps": max(int(config.steps) // 10, 1)}
    try:
        spec = exploration_lib.parse(spec, True)
    except ValueError as error:
        raise ConfigError(f"config key 'exploration': {error}") from None
    if spec["type"] != "epsilon_decay":
        raise ConfigError(f"pqn explores with exploration: {{type: epsilon_decay, ...}}, "
                          f"got type {spec['type']!r}")
    return spec


class PQN(OnPolicyAlgorithm):
    """PQN (Gallici et al. 2025): see the module docstring.

    Once every agent took `rollout_length` steps (or an actor's fragment arrives), the
    rollout's Q(lambda) targets (`q_lambda_returns`, discount `discount`, lambda
    `q_lambda`) are computed once before the update, from the Q values the steps were
    acted with (`_recorded_value`) and the Q network on the observations that end an
    episode or a row; then
    `update_epochs` epochs, each over the valid steps in a new random order, take one step
    of the config's `optimizer` (default Adam; Gallici et al. use RAdam) at `policy_lr`
    (decayed with `lr_schedule: linear`), its gradient clipped to `max_gradient_norm`, per
    minibatch of `batch_size` steps (null: all), on half the mean squared error
    `(Q(s_t, a_t) - G_t)^2`. For a `MultiDiscrete` space, Q(s, a) is the mean over the
    choices of each choice's Q value (Tavakoli et al. 2018, eq. 6). Diagnostics under
    `pqn/`: `loss` (of the last minibatch), `gradient_norm` (mean over the steps), `q`
    (mean max_a Q(s_t, a) before the update), `mean_target` (mean G_t), `epsilon`, and
    the histogram `target`.

    Args:
      as for `OnPolicyAlgorithm`; config also `rollout_length` (required), `q_lambda`,
      `update_epochs`, `batch_size`, `policy_lr`, `optimizer`, `max_gradient_norm`,
      `lr_schedule`, `exploration`, `jit_update`.

    Raises:
      ConfigError: no `rollout_length`, an `exploration` other than `epsilon_decay`, or an
        `optimizer` that does not step on gradients (`natural_gradient`, `line_search`).
    """

    name = "pqn"
    actor_class = PQNActor
    histograms = ("target",)
    config_keys = OnPolicyAlgorithm.config_keys | {
        "rollout_length", "q_lambda", "update_epochs", "batch_size", "policy_lr",
        "optimizer", "max_gradient_norm", "lr_schedule", "exploration", "jit_update"}

    @staticmethod
    def check_config(config):
        """Raises ConfigError without `rollout_length` or with an exploration other than
        `epsilon_decay` (before anything is built)."""
        if not config.rollout_length:
            raise ConfigError("pqn learns from rollouts: set config key 'rollout_length' "
                              "(e.g. 64)")
        exploration_spec(config)

    def __init__(self, batch_env, step, is_training, should_log, config):
        super().__init__(batch_env, step, is_training, should_log, config)
        optimizer = optimizers.create(config.optimizer or {"type": "adam"}, config.policy_lr,
                                      config.max_gradient_norm)
        if not optimizer.steps_on_gradients:
            raise ConfigError("config key 'optimizer': pqn steps on the gradient of each "
                              "minibatch's TD error, which adam, radam, sgd and rmsprop do")
        self._build_optimizers(optimizer, None)

    @property
    def checkpoint_state(self):
        """`OnPolicyAlgorithm.checkpoint_state` without `value` (`MaxQ` holds no variables
        of its own) and with the Keras optimizer (`optimizer`)."""
        state = dict(super().checkpoint_state)
        del state["value"]
        state["optimizer"] = state.pop("policy_optimizer").optimizer
        return state

    def _scale_learning_rates(self, scale):
        return self._policy_optimizer.scale_learning_rate(scale)

    def _recorded_value(self, rows, observ):
        """max_a Q(s_t, a) of the Q values each step was acted with (its `policy_<param>`),
        as purejaxql keeps them: in one process the weights do not change within a rollout,
        so these are the Q network's now and the update saves a forward pass over the
        rollout (4,096 frames per update for `pong_pqn`); an actor's are its copy's."""
        (key,) = self._param_shapes
        return max_q(rows["policy_" + key], self._acting.choices)

    def update(self, batch):
        """The update (see the class docstring) on a batch of rollouts (`[rows, time,
        ...]`, static shapes).

        Returns:
          dict of float32 scalars for the summaries, the batch's `mask` and `target`.
        """
        config, mask = self._config, batch["mask"]
        target = q_lambda_returns(batch["reward"], batch["value"], batch["next_value"],
                                  batch["terminated"], batch["done"], batch["length"],
                                  config.discount, config.q_lambda)
        steps = {key: tf.reshape(value, tf.concat([[-1], tf.shape(value)[2:]], 0))
                 for key, value in (("observ", batch["observ"]),
                                    ("action", batch["action"]), ("target", target))}
        metrics = parts.minibatch_epochs(
            steps, tf.reshape(mask, [-1]) > 0, config.batch_size, config.update_epochs,
            self._random, self._minibatch_step, ("loss",), ("gradient_norm",))
        return dict(metrics, q=advantage_lib.masked_mean(batch["value"], mask),
                    mean_target=advantage_lib.masked_mean(target, mask),
                    epsilon=self._acting.epsilon(), mask=mask, target=target)

    def _minibatch_step(self, minibatch, in_range):
        """One optimizer step on half the mean squared TD error of the minibatch's steps
        in range; returns `({"loss": ...}, {"gradient_norm": ...})`."""
        q_network = self._networks.policy
        with tf.GradientTape() as tape:
            q = q_values(q_network, minibatch["observ"][:, None])[:, 0]
            action = tf.cast(minibatch["action"], tf.int32)
            taken = tf.gather(q, action, batch_dims=len(action.shape))
            if self._acting.choices:
                taken = tf.reduce_mean(taken, -1)
            error = tf.square(taken - minibatch["target"])
            loss = 0.5 * tf.reduce_sum(in_range * error) / tf.maximum(
                tf.reduce_sum(in_range), 1.0)
        norm = parts.apply_gradients(tape, loss, q_network.trainable_variables,
                                     self._policy_optimizer)
        return {"loss": loss}, {"gradient_norm": norm}
