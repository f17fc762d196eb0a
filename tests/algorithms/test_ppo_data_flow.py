"""BatchPPO's update data flow end to end, on small runs of `simulate`.

`_Run` steps PPO one `simulate` call at a time over `_RecordingEnv`s, which keep every
observation and reward they return and whose observations drift, so that the observation
normalizer's statistics move at every step. Before each call it snapshots the normalizer's
mean and standard deviation and the networks' weights; after it, it reads the transition
each agent just appended to its episode (`algo._episodes`) and the episodes moved into the
update memory (`algo._memory`, read before later updates overwrite it). The tests recompute
what should have been stored from these and compare. Updates run during the runs (every two
episodes), so the weights change between the steps of the longer episodes.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from gymnasium import spaces

from batchrl import configs
from batchrl.algorithms.ppo import PPO
from batchrl.drivers.simulate import episode_state, simulate
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.networks import NETWORKS
from batchrl.scripts import events
from tests.algorithms.ppo_memory import load_memory
from tests.recording_environment import RecordingEnvironment

TOL = dict(rtol=1e-5, atol=1e-6)
# Agent 0's episodes are truncated (3 steps), agent 1's terminate (4 steps), agent 2's last
# 5 to 9 steps: the first update (at call 4) holds one truncated and one terminated episode.
DURATIONS = [(3, 3, True), (4, 4, False), (5, 9, False)]


class _RecordingEnv(RecordingEnvironment):
    """Records every observation and reward it returns; observation `k` of the environment
    is offset by `0.5 * k`. `discrete`: a `Discrete(discrete)` action space."""

    def __init__(self, low, high, truncate, discrete=None):
        super().__init__((3,), () if discrete else (2,), low, high, truncate=truncate)
        if discrete:
            self.action_space = spaces.Discrete(discrete)
        self.truncates = truncate

    def _observation(self):
        return (super()._observation() + 0.5 * len(self.observations)).astype(np.float32)


def _normalize(raw, mean, std):
    """What PPO's observation normalizer computes, in NumPy."""
    return np.clip((raw - mean) / (std + np.float32(1e-8)), -5.0, 5.0)


class _Run:
    """PPO in `simulate` over `_RecordingEnv`s; `step()` runs one call and records it.

    `records[call]`: `raw` / `raw_next` (observations acted on / after the step), `reward`,
    `mean` / `std` (normalizer before the call), `mean_after` / `std_after`, `reward_std`
    (reward normalizer after the call), `began`, `stored` (the transition each agent
    appended), `version` (updates before the call). `versions[v]`: the policy and value
    weights after `v` updates. `moved`: the episodes moved into the memory (`agent`,
    `calls`, `data`, `final`, `terminated`, `update`); `updates`: the call of each update.
    """

    def __init__(self, durations, logdir=None, discrete=None, **overrides):
        self.envs = [_RecordingEnv(low, high, truncate, discrete)
                     for low, high, truncate in durations]
        for index, env in enumerate(self.envs):
            env.reset(seed=index)
        keras.utils.set_random_seed(0)  # The networks' initial weights.
        batch_env = InGraphBatchEnv(BatchEnv(self.envs, blocking=True))
        config = configs.load("default", {
            "policy_layers": [8, 6], "value_layers": [8], "update_every": 2,
            "update_epochs": 1, "policy_lr": 1e-2, "value_lr": 1e-2})
        config.update({"max_length": 9, **overrides})
        self.config = config
        self.step_var = tf.Variable(0, dtype=tf.int64)
        self.algo = PPO(batch_env, self.step_var, tf.Variable(True), tf.Variable(True), config)
        episode_state(batch_env)  # Its variables exist before the trace: one trace, not two.
        self.parts = self.algo.checkpoint_state
        # Networks of the same shape, loaded with the weights of a given moment.
        self.twin = config.network(batch_env.observation_space, batch_env.action_space, config)
        self.logdir = logdir
        writer = tf.summary.create_file_writer(str(logdir)) if logdir else None
        self.writer = writer

        @tf.function(input_signature=[], autograph=False)
        def call():
            if writer is None:
                return simulate(batch_env, self.algo, False, False)
            with writer.as_default(step=self.step_var):
                return simulate(batch_env, self.algo, False, False)

        self._call = call
        self.records, self.moved, self.updates = [], [], []
        self.versions = [self._weights()]
        self._done = np.ones(len(self.envs), bool)
        self._current = [[] for _ in self.envs]

    def _weights(self):
        return {"policy": self.parts["policy"].get_weights(),
                "value": self.parts["value"].get_weights()}

    def set_twin(self, version):
        self.twin.policy.set_weights(self.versions[version]["policy"])
        self.twin.value.set_weights(self.versions[version]["value"])

    def step(self):
        observ_filter = self.parts["observ_filter"]
        mean, std = observ_filter.mean.numpy(), observ_filter.std.numpy()
        iterations = int(self.parts["policy_optimizer"].iterations)
        call = len(self.records)
        self.step_var.assign(call)
        done = self._call()[0].numpy()
        episodes, length = self.algo._episodes.data()
        rows, index = np.arange(len(self.envs)), length.numpy() - 1
        record = dict(
            raw=np.stack([env.observations[-2] for env in self.envs]),
            raw_next=np.stack([env.observations[-1] for env in self.envs]),
            reward=np.array([env.rewards[-1] for env in self.envs]),
            mean=mean, std=std, mean_after=observ_filter.mean.numpy(),
            std_after=observ_filter.std.numpy(),
            reward_std=self.parts["reward_filter"].std.numpy(), began=self._done,
            stored={key: value.numpy()[rows, index] for key, value in episodes.items()},
            version=len(self.versions) - 1)
        self.records.append(record)
        for agent in rows:
            if self._done[agent]:
                self._current[agent] = []
            self._current[agent].append(call)
        # Episodes that end move into the memory's free rows (in agent order, the rest are
        # dropped); the memory's contents survive the update that a full memory triggers.
        memory, _ = self.algo._memory.data()
        pending = [m for m in self.moved if m["update"] is None]
        for agent in np.flatnonzero(done)[:self.config.update_every - len(pending)]:
            row = len(pending)
            pending.append(dict(
                agent=agent, calls=list(self._current[agent]), update=None,
                data={key: value.numpy()[row, :len(self._current[agent])]
                      for key, value in memory.items()},
                final=self.algo._memory_final.numpy()[row],
                terminated=bool(self.algo._memory_terminated.numpy()[row])))
            self.moved.append(pending[-1])
        updated = len(pending) == self.config.update_every
        assert updated == (int(self.parts["policy_optimizer"].iterations) > iterations)
        assert int(self.algo._memory_index.numpy()) == (0 if updated else len(pending))
        if updated:
            for episode in pending:
                episode["update"] = call
            self.updates.append(call)
            self.versions.append(self._weights())
        self._done = done
        return done


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """`played(network)`: a `_Run` of 20 calls with that network (one run per network)."""
    runs = {}

    def get(network):
        if network not in runs:
            overrides = dict(chunk_length=2) if network == "recurrent_gaussian" else {}
            run = _Run(DURATIONS, tmp_path_factory.mktemp(network), network=NETWORKS[network],
                       discrete=3 if "categorical" in network else None, **overrides)
            for _ in range(20):
                run.step()
            run.writer.flush()
            assert len(run.updates) >= 4
            runs[network] = run
        return runs[network]

    return get


NETWORK_NAMES = ["feed_forward_gaussian", "feed_forward_categorical", "recurrent_gaussian"]


@pytest.mark.parametrize("network", NETWORK_NAMES)
def test_stored_observations_use_the_statistics_in_force_when_acting(played, network):
    """Each stored observation is the raw one the agent acted on, normalized with the
    normalizer's mean and std from before that step's update, not after it; the memory
    holds exact copies of the episodes' stored transitions."""
    run = played(network)
    moved_later = 0.0
    for record in run.records:
        stored = record["stored"]["observ"]
        np.testing.assert_allclose(
            stored, _normalize(record["raw"], record["mean"], record["std"]), **TOL)
        later = _normalize(record["raw"], record["mean_after"], record["std_after"])
        moved_later = max(moved_later, np.abs(stored - later).max())
        np.testing.assert_array_equal(record["stored"]["reward"], record["reward"])
    assert moved_later > 1e-2, "the statistics moved enough to tell before from after"
    for episode in run.moved:
        for key, value in episode["data"].items():
            want = np.stack([run.records[c]["stored"][key][episode["agent"]]
                             for c in episode["calls"]])
            np.testing.assert_array_equal(value, want, err_msg=key)


@pytest.mark.parametrize("network", NETWORK_NAMES)
def test_stored_policy_parameters_are_the_acting_policys(played, network):
    """The stored `policy_*` parameters of each step equal the policy's output on the stored
    observation (and state) with the weights of that step, before any later update; each
    update's logged KL is measured from these stored parameters (not from the policy at the
    update's start) to the updated policy."""
    run = played(network)
    keys = [key[len("policy_"):] for key in run.records[0]["stored"] if key.startswith("policy_")]
    assert keys == (["logits"] if "categorical" in network else ["mean", "logstd"])
    for record in run.records:
        stored = record["stored"]
        run.set_twin(record["version"])
        state = stored.get("state", np.zeros((len(run.envs), 0), np.float32))
        params, _ = run.twin.policy(stored["observ"][:, None], state)
        for key in keys:
            np.testing.assert_allclose(stored["policy_" + key], params[key][:, 0], **TOL)
    # Each update measures the KL from the stored (behaviour) parameters to the updated
    # policy, which differs from a KL from the policy before the update once episodes span
    # updates (unless the config asks for that reference).
    reference = run.config.get("kl_reference", "behaviour")
    logged = events.read_scalars(run.logdir, "ppo/kl")
    assert [scalar.step for scalar in logged] == run.updates
    zeros = np.zeros((1, run.twin.policy.state_size), np.float32)
    gap = 0.0
    for index, (call, scalar) in enumerate(zip(run.updates, logged, strict=True)):
        kl = {"behaviour": [], "update_start": []}
        for episode in (e for e in run.moved if e["update"] == call):
            observ = episode["data"]["observ"][None]
            run.set_twin(index)
            start, _ = run.twin.policy(observ, zeros)
            run.set_twin(index + 1)
            new = run.twin.distribution(run.twin.policy(observ, zeros)[0])
            stored = {key: episode["data"]["policy_" + key][None] for key in keys}
            for name, old in (("behaviour", stored), ("update_start", start)):
                kl[name].append(run.twin.distribution(old).kl(new).numpy()[0])
        kl = {name: np.concatenate(values).mean() for name, values in kl.items()}
        np.testing.assert_allclose(scalar.value, kl[reference], rtol=1e-4, atol=1e-7)
        gap = max(gap, abs(kl["behaviour"] - kl["update_start"]) / kl[reference])
    assert gap > 0.1, "episodes spanned updates"


def _replay(run, episode, start, end, state):
    run.set_twin(run.records[episode["calls"][start]]["version"])
    params, _ = run.twin.policy(episode["data"]["observ"][None, start:end], state[None])
    return {key: value[0].numpy() for key, value in params.items()}


def test_recurrent_chunks_replay_from_the_stored_states(played):
    """Recurrent policy, chunks of 2 steps: the stored state is zero at the episode's first
    step and, later, the state the policy returned at the previous step; replaying the policy
    over a chunk from the state stored at its first step reproduces the stored parameters of
    all its steps; and in the first update's full-batch step the KL between the stored and
    the replayed policy is zero (the logged policy loss equals the surrogate)."""
    run = played("recurrent_gaussian")
    following = None
    for record in run.records:
        stored = record["stored"]
        for agent, began in enumerate(record["began"]):
            if began:
                np.testing.assert_array_equal(stored["state"][agent], 0.0)
            else:
                np.testing.assert_allclose(stored["state"][agent], following[agent], **TOL)
        run.set_twin(record["version"])
        _, following = run.twin.policy(stored["observ"][:, None], stored["state"])
        following = following.numpy()
    chunk, replayed, kl_if_zero = run.config.chunk_length, 0, []
    for episode in run.moved:
        data, length = episode["data"], len(episode["calls"])
        versions = [run.records[c]["version"] for c in episode["calls"]]
        for start in range(0, length, chunk):
            end = min(start + chunk, length)
            if len(set(versions[start:end])) > 1:
                continue  # Acted with two sets of weights: no single replay reproduces it.
            params = _replay(run, episode, start, end, data["state"][start])
            for key in ("mean", "logstd"):
                np.testing.assert_allclose(params[key], data["policy_" + key][start:end], **TOL)
            replayed += start > 0
            if episode["update"] == run.updates[0]:
                zero = _replay(run, episode, start, end, np.zeros_like(data["state"][0]))
                stored = {key: data["policy_" + key][start:end] for key in ("mean", "logstd")}
                distribution = run.twin.distribution
                kl_if_zero += list(distribution(stored).kl(distribution(zero)).numpy())
    assert replayed >= 5, "chunks that start inside an episode were replayed"
    loss = events.read_scalars(run.logdir, "ppo/policy_loss")[0]
    surrogate = events.read_scalars(run.logdir, "ppo/surrogate")[0]
    assert loss.step == surrogate.step == run.updates[0]
    assert abs(loss.value - surrogate.value) < 1e-6
    assert np.mean(kl_if_zero) > 1e-4, "a replay from the zero state would show in the loss"


STEPS_RUN = dict(update_every=3, update_epochs=3, max_length=8,
                 network=NETWORKS["feed_forward_gaussian"])


@pytest.fixture(scope="module")
def three_episodes():
    """A `_Run` (chunks of 2 steps, minibatches of 3) over episodes of 3, 5 and 7 steps,
    played until its memory of 3 episodes is full and trains, once: its optimizers' steps
    then, and the memory it trained on (episodes of 3, 5 and 3 steps, padded to the
    memory's 8 steps) for `test_optimizer_steps_per_update` to load into runs of the other
    settings, which update on it without playing (and tracing `simulate`) again."""
    run = _Run([(3, 3, False), (5, 5, False), (7, 7, False)], chunk_length=2, batch_size=3,
               **STEPS_RUN)
    for _ in range(5):
        run.step()
    optimizers = [run.parts["policy_optimizer"], run.parts["value_optimizer"]]
    assert [int(optimizer.iterations) for optimizer in optimizers] == [0, 0]
    lengths = [len(episode["calls"]) for episode in run.moved]
    assert lengths == [3, 5]
    run.step()  # Agent 0's second episode ends: the memory is full and trains.
    episodes = run.moved[-3:]
    assert [len(episode["calls"]) for episode in episodes] == [3, 5, 3]
    padded = {key: np.stack([np.concatenate([
        episode["data"][key],
        np.zeros((8 - len(episode["calls"]),) + episode["data"][key].shape[1:],
                 episode["data"][key].dtype)]) for episode in episodes])
        for key in episodes[0]["data"]}
    return dict(
        iterations=[int(optimizer.iterations) for optimizer in optimizers], episodes=padded,
        length=np.array([3, 5, 3], np.int32),
        final=np.stack([episode["final"] for episode in episodes]),
        terminated=np.array([episode["terminated"] for episode in episodes]))


@pytest.mark.parametrize("chunk_length, batch_size, per_epoch", [
    (None, None, 1),  # Whole episodes, one full batch.
    (None, 2, 2),     # 3 episodes in minibatches of 2.
    (2, 3, 3),        # 2 + 3 + 2 = 7 chunks in minibatches of 3: `three_episodes`' run.
    (2, 20, 1),       # A minibatch larger than all chunks.
])
def test_optimizer_steps_per_update(three_episodes, chunk_length, batch_size, per_epoch):
    """One update takes update_epochs * ceil(valid chunks / batch_size) steps of the policy
    and of the value optimizer (one per epoch for batch_size null); the memory holds episodes
    of 3, 5 and 3 steps, cut into chunks of chunk_length steps (null: whole episodes)."""
    chunks = sum(math.ceil(n / (chunk_length or 8)) for n in three_episodes["length"])
    assert per_epoch == math.ceil(chunks / (batch_size or chunks))
    if (chunk_length, batch_size) == (2, 3):
        assert three_episodes["iterations"] == [3 * per_epoch] * 2
        return
    run = _Run([(3, 3, False), (5, 5, False), (7, 7, False)], chunk_length=chunk_length,
               batch_size=batch_size, **STEPS_RUN)
    algo = run.algo
    load_memory(algo, three_episodes)
    algo._update()
    optimizers = [run.parts["policy_optimizer"], run.parts["value_optimizer"]]
    assert [int(optimizer.iterations) for optimizer in optimizers] == [3 * per_epoch] * 2


def _gae_targets(reward, value, bootstrap, discount, lam):
    advantage, running = np.zeros_like(reward), 0.0
    for t in reversed(range(len(reward))):
        following = bootstrap if t == len(reward) - 1 else value[t + 1]
        running = reward[t] + discount * following - value[t] + discount * lam * running
        advantage[t] = running
    return advantage + value


def test_truncated_episodes_bootstrap_from_the_final_observation(played):
    """The memory keeps each episode's final observation (normalized with the statistics of
    its last step) and whether it terminated; the first update's logged mean return and
    value loss (one full-batch step) equal those of lambda-returns that bootstrap a
    truncated episode from the value of its final observation and a terminated one from 0,
    and differ from those of the other rules."""
    run = played("feed_forward_gaussian")
    config, first = run.config, run.updates[0]
    episodes = [episode for episode in run.moved if episode["update"] == first]
    assert [episode["terminated"] for episode in episodes] == [False, True]
    for episode in run.moved:
        agent, last = episode["agent"], run.records[episode["calls"][-1]]
        assert episode["terminated"] == (not run.envs[agent].truncates)
        want = _normalize(last["raw_next"][agent], last["mean"], last["std"])
        np.testing.assert_allclose(episode["final"], want, **TOL)
    run.set_twin(run.records[first]["version"])
    reward_std = run.records[first]["reward_std"]
    results = {}
    for rule in ("truncated", "both", "neither", "terminated"):
        targets, values = [], []
        for episode in episodes:
            reward = np.array([run.records[c]["reward"][episode["agent"]]
                               for c in episode["calls"]])
            reward = np.clip(reward / (reward_std + 1e-8), -10.0, 10.0)
            value = run.twin.value(episode["data"]["observ"][None])[0].numpy()
            final = run.twin.value(episode["final"][None, None])[0, 0].numpy()
            bootstraps = {"truncated": not episode["terminated"], "both": True,
                          "neither": False, "terminated": episode["terminated"]}[rule]
            targets.append(_gae_targets(reward, value, final * bootstraps, config.discount,
                                        config.gae_lambda))
            values.append(value)
        targets, values = np.concatenate(targets), np.concatenate(values)
        results[rule] = np.array([targets.mean(), 0.5 * np.mean((values - targets) ** 2)])
    logged = [events.read_scalars(run.logdir, "ppo/" + tag)[0]
              for tag in ("mean_return", "value_loss")]
    assert [scalar.step for scalar in logged] == [first, first]
    logged = np.array([scalar.value for scalar in logged])
    np.testing.assert_allclose(logged, results["truncated"], rtol=1e-5, atol=1e-6)
    for rule in ("both", "neither", "terminated"):
        assert np.abs(results[rule] - logged).max() > 1e-3, rule
