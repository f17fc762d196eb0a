"""How an on-policy algorithm learns from an actor's fragments (`learn`): the fragment
becomes the batch its memory of rollouts would give, and the algorithm's own `update` runs
on it; the same function traced ahead of the first fragment (`trace_learn`)."""

import numpy as np
import tensorflow as tf

from batchrl.algorithms import advantage as advantage_lib


class FragmentLearning:
    """The fragment half of `batchrl.algorithms.on_policy.OnPolicyAlgorithm` (a mixin: it
    reads the algorithm's memory layout, normalizers and compiled functions)."""

    def learn(self, recording, log=False):
        """One update on a fragment that an actor recorded (`recording`,
        `batchrl.distributed.fragment.FragmentRecorder.record`: raw observations, rewards,
        the behaviour policy's parameters, `[rows, rollout_length, ...]`, any number of
        rows): it becomes the batch a memory of rollouts gives (`_rollout_batch`) and
        `update(batch)` runs on it, for every algorithm that reads `rollout_length`. The
        observations are normalized with the statistics as they are, which the fragment's
        valid steps then update, as they update the reward normalizer's (with its rewards,
        or for `reward_normalizer: return` the discounted returns the actor recorded,
        `return`: an agent's return runs on across its fragments there). With `log`, the
        update's summaries (`_train`'s) go to the default summary writer at its default
        step. Returns the diagnostics of `update` (tensors) and `updates`: 1. Only V-trace
        (IMPALA, APPO) corrects the value targets for the lag; the others' ratios are
        taken to the stored policy that acted.

        Raises:
          NotImplementedError: the algorithm declares no fragments (`actors`: it does not
            read `rollout_length` and learns from whole episodes only).
          ValueError: `rollout_length` is null.
          KeyError: `reward_normalizer: return` and a fragment without `return`.
        """
        if self.actors != "fragments":
            return super().learn(recording, log)
        if not self._rollout_length:
            raise ValueError(f"{self.name} learns from fragments with rollout_length set")
        padding = self._memory_length - np.shape(recording["reward"])[1]
        if padding > 0:  # PPO's `chunk_length` does not divide `rollout_length`.
            recording = {key: value if key == "length" else np.pad(
                value, [(0, 0), (0, padding)] + [(0, 0)] * (np.ndim(value) - 2))
                for key, value in recording.items()}
        return {**self._learn_and_log(recording, tf.constant(bool(log))), "updates": 1}

    def trace_learn(self, rows):
        """Traces `learn`'s function for fragments of `rows` rows (an actor's
        `envs_per_actor`) before the first arrives, e.g. while the actors start; runs and
        changes nothing. The fragment's fields are those `FragmentRecorder` records (raw
        observations in the environment's dtype)."""
        observ = (tuple(self._batch_env.observ.shape[1:]), self._batch_env.observ.dtype)
        fields = {"observ": observ, "next_observ": observ,
                  "action": (tuple(self._batch_env.action.shape[1:]),
                             self._batch_env.action.dtype),
                  "reward": ((), tf.float32), "done": ((), tf.bool),
                  "terminated": ((), tf.bool), **self._acting.acting_specs}
        if by_return(self._config):
            fields["return"] = ((), tf.float32)
        specs = {key: tf.TensorSpec((rows, self._memory_length) + tuple(shape), dtype)
                 for key, (shape, dtype) in fields.items()}
        specs["length"] = tf.TensorSpec([rows], tf.int32)
        self._learn_and_log.get_concrete_function(specs, tf.TensorSpec([], tf.bool))

    def _fragment_learn(self, fragment, log):
        """`learn`'s function: the update (`_learn`, compiled with XLA under `jit_update`),
        then its summaries while `log`."""
        result = self._learn(fragment)
        with tf.control_dependencies(self._update_summaries(result, log)):
            return {key: tf.identity(value) for key, value in result.items()}

    def _fragment_update(self, fragment):
        """`update` on the batch of a fragment, with the keys of `_memory_batch`."""
        length = tf.convert_to_tensor(fragment["length"], tf.int32)
        reward = tf.convert_to_tensor(fragment["reward"], tf.float32)
        mask = advantage_lib.sequence_mask(length, tf.shape(reward)[1])
        with tf.control_dependencies(self._schedule_learning_rates()):
            observ = self._normalized(fragment["observ"])
            next_observ = self._normalized(fragment["next_observ"])
        valid, shared = mask > 0, self._all_reduce
        statistic = fragment["return"] if by_return(self._config) else reward
        statistics = [self._reward_filter.update(
            tf.boolean_mask(tf.convert_to_tensor(statistic, tf.float32), valid), shared)]
        if not self._raw_observ:
            with tf.control_dependencies([observ, next_observ]):
                statistics.append(self._observ_filter.update(
                    tf.boolean_mask(fragment["observ"], valid), shared))
        with tf.control_dependencies(statistics):
            rows = dict(fragment, reward=reward,
                        done=tf.convert_to_tensor(fragment["done"], tf.bool))
            batch = self._rollout_batch(rows, observ, next_observ, length)
        return self.update(batch)


def by_return(config):
    """Whether `config` scales the rewards by the standard deviation of the agents'
    discounted returns (`normalize_reward` with `reward_normalizer: return`), which an
    actor's fragments then carry (`FragmentRecorder`'s `return_discount`). bool."""
    return bool(config.normalize_reward) and config.reward_normalizer == "return"
