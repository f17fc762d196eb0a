"""The learner of an Ape-X run (Horgan et al. 2018, "Distributed Prioritized Experience
Replay", arXiv:1803.00933): it owns the replay memory, stores the n-step transitions the
actors send with their first priorities, and makes the updates they are owed, so that the
replay ratio is the config's `updates_per_step` whatever the actors' speed."""

import time

import tensorflow as tf

from batchrl.distributed.learner import ActorLearnerLoop


class ApexLoop(ActorLearnerLoop):
    """An `ActorLearnerLoop` for an off-policy algorithm (`dqn`, `sac`, `td3`) whose actors
    are `batchrl.distributed.actor.TransitionActor`s.

    Each recording taken from the actors goes into the learner's replay memory
    (`OffPolicyAlgorithm.learn`: its transitions with priorities from the
    actor's TD errors, when prioritized), and the learner then makes the updates its
    environment steps are owed, `updates_per_step` per step once the memory holds
    `learning_starts`, before it takes the next. So the replay ratio is held: the learner
    never runs ahead of the data (it waits for the next recording), and the actors never
    run ahead of the learner by more than `fragments_in_flight` recordings each (the
    pool's bound), which also bounds the memory in flight. Prioritized replay's beta
    anneals to 1 over the run's `steps` (`OffPolicyAlgorithm._beta`).

    Policy versions count updates: the actors get the weights of the learner's acting half
    (`OffPolicyActor.get_weights`: the policy, the observation filter, the critic of the TD
    error and the global step, for exploration schedules) at each train phase's start,
    whenever `broadcast_every` more updates were made, and after every recording while no
    update was made since the last publication (before `learning_starts`, so that the
    actors' epsilon schedules follow the learner's step); policy lag and `max_policy_lag`
    are in updates too.

    Besides `ActorLearnerLoop`'s summaries, the train writer receives under `apex/`, over
    the recordings since the last write: `replay_ratio` (updates per environment step,
    which `updates_per_step` sets once learning started), `insert_rate` (transitions
    stored per second), `sample_rate` (transitions sampled per second: updates times
    `batch_size`), and `replay_fill` (the memory's size over its capacity).

    Args:
      as for `ActorLearnerLoop`; `algo` an `OffPolicyAlgorithm`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._inserted = 0  # Transitions stored since the last write.

    def _recording(self, sent):
        """A recording travels as it was made; counts its transitions."""
        self._inserted += len(sent["td_error"])
        return sent

    def _write_window(self, window, step, scores, lengths):
        super()._write_window(window, step, scores, lengths)
        seconds = max(time.time() - window.started, 1e-9)
        memory = self._algo.memory
        with self._writers["train"].as_default(step=step):
            tf.summary.scalar("apex/replay_ratio", window.updates / max(step - window.step, 1))
            tf.summary.scalar("apex/insert_rate", self._inserted / seconds)
            tf.summary.scalar("apex/sample_rate",
                              window.updates * self._algo.batch_size / seconds)
            tf.summary.scalar("apex/replay_fill",
                              float(memory.size.numpy()) / memory.capacity)
        self._inserted = 0
