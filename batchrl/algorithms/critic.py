"""The critic of an off-policy algorithm: the networks its TD error reads beside the acting
half's policy (Q functions, their targets, SAC's temperature), buildable alone for an acting
half, without optimizers or a replay memory, and the TD error itself. The learner's update
regresses `q_values` on `target`; an Ape-X actor builds the acting half with this critic
and nothing else, and gives its transitions their first priorities with `td_error` (Horgan
et al. 2018, "Distributed Prioritized Experience Replay", arXiv:1803.00933, section 3 and
algorithm 1)."""

import abc
import math

import tensorflow as tf

from batchrl.algorithms import off_policy
from batchrl.networks import q_networks


class Critic(abc.ABC):
    """The TD error's networks and terms; built as `CriticClass(acting, config)` by
    `OffPolicyActor.build_critic`, after the acting half's policy, in the order the
    algorithm has always built them (the networks' initial weights follow the order).

    Args:
      acting: the `batchrl.algorithms.actor.OffPolicyActor` whose policy the TD error may
        read (DQN's online Q network, SAC's actor for the next action) and whose generator
        draws what the target samples.
      config: the algorithm's config (`value_layers`, `activation`, optional `torso`, and
        what the subclass reads).

    Attributes:
      trackables: dict of str to the networks and variables it built, under the keys of the
        algorithm's `checkpoint_state`.
    """

    def __init__(self, acting, config):
        self.acting = acting
        self._config = config
        self.trackables = {}

    @property
    def variables(self):
        """The variables of `trackables`, in their order: what an Ape-X actor receives
        with the policy (`OffPolicyActor.variables`)."""
        variables = []
        for value in self.trackables.values():
            variables.extend([value] if isinstance(value, tf.Variable) else value.variables)
        return variables

    @abc.abstractmethod
    def q_values(self, batch):
        """Q(s, a) of a batch's transitions (normalized float32 `observ`): float32 `[n]`, or
        `[k, n]` for k Q functions."""

    @abc.abstractmethod
    def target(self, batch):
        """The regression target y of the Q function(s) for a batch's transitions (normalized
        `observ` and `nextob`, `action`, `reward`, `discount`), without gradient: float32
        `[n]`."""

    def td_error(self, batch):
        """The absolute TD errors of transitions under the current networks, changing no
        variable but the acting half's generator: `|Q(s, a) - y|` (`q_values`, `target`),
        the mean over the Q functions for SAC and TD3, as the update's `td_error`.

        Args:
          batch: dict of `observ`, `nextob` raw `[n, *observation_shape]`, `action`
            `[n, *action_shape]`, `reward` and `discount` float32 `[n]` (as stored).

        Returns:
          float32 `[n]`.
        """
        batch = dict(batch, observ=self.normalized(batch["observ"]),
                     nextob=self.normalized(batch["nextob"]))
        error = tf.abs(self.q_values(batch) - self.target(batch))
        return error if error.shape.rank == 1 else tf.reduce_mean(error, 0)

    def normalized(self, observ):
        """Raw observations as the networks take them: float32, through the acting half's
        observation filter."""
        return self.acting.observ_filter.transform(tf.cast(observ, tf.float32))


class TwinCritic(Critic):
    """SAC's and TD3's critic: twin Q functions of the observation and the flat action
    (`value_layers`; with declared layers, the config's `torso`, each Q function its own)
    built first; a subclass adds the targets (`target_critic`, with `make_target_critic`)
    and what else its target reads.

    Attributes:
      critic: the `q_networks.TwinQ`.
    """

    def __init__(self, acting, config):
        super().__init__(acting, config)
        self._inputs = (tf.zeros((1,) + acting.observ_shape),
                        tf.zeros((1, int(math.prod(acting.action_shape)))))
        self.critic = self._make_critic()

    def _make_critic(self):
        config, space = self._config, self.acting.observation_space
        torso = config.get("torso")  # Declared layers (`build` makes the factory).
        torsos = None if torso is None else [torso(space), torso(space)]
        return q_networks.TwinQ(config.value_layers, config.activation, torsos=torsos)

    def make_target_critic(self):
        """A target of `critic`: the same architecture, its weights (`off_policy.target_of`)."""
        return off_policy.target_of(self.critic, self._make_critic, *self._inputs)

    def q_values(self, batch):
        return self.critic(batch["observ"], off_policy.flat_action(batch["action"]))
