"""Ape-X in this process, without Ray (Horgan et al. 2018, arXiv:1803.00933): an actor's
transitions are those its steps completed, with its networks' TD errors as their first
priorities; each agent explores with its own epsilon; the learner's loop holds the replay
ratio, counts versions in updates and broadcasts every `broadcast_every` of them."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, configs, environments
from batchrl.algorithms import exploration as exploration_lib
from batchrl.algorithms.dqn import DQN
from batchrl.algorithms.sac import SAC
from batchrl.algorithms.td3 import TD3
from batchrl.distributed import actor as actor_lib
from batchrl.distributed.apex import ApexLoop
from batchrl.distributed.pool import Fragment
from batchrl.distributed.transitions import TransitionRecorder
from batchrl.drivers.simulate import episode_state, simulate_steps
from batchrl.memories.replay import ReplayMemory
from batchrl.memories.storage import FIELDS
from tests import off_policy_numpy as ref
from tests.distributed.test_actor_learner import _scalars

GAMMA = 0.985  # default.yaml's discount.


def _box_batch():
    batch = ref.box_batch(8, 2, GAMMA)
    del batch["weight"]
    return batch


@pytest.mark.parametrize("algorithm", ["dqn", "sac", "td3"])
def test_an_actors_first_priorities_are_its_networks_absolute_td_errors(algorithm):
    """`Critic.td_error`: |Q(s, a) - y| with y an update's target (for SAC and TD3 the mean over
    the two critics), from the weights read out of the networks and the same draws, and
    no network changed. Catches: the online network in place of a target; the signed
    error; one critic's error; the discount past a termination."""
    if algorithm == "dqn":
        algo = ref.build(DQN, ref.mock_env(num_actions=4), target_update_rate=1.0)
        state = algo.checkpoint_state
        ref.perturb(state["target_policy"], 0.5, seed=1)
        rng = np.random.default_rng(0)
        batch = _box_batch()
        batch["action"] = rng.integers(0, 4, 8).astype(np.int32)
        q, target = (ref.q_network_weights(state[key]) for key in ("policy", "target_policy"))
        y, *_ = ref.dqn_target(q, target, batch, np.ones((8, 4), bool), True)
        want = np.abs(ref.q_network(q, batch["observ"])[np.arange(8), batch["action"]] - y)
    else:
        cls = SAC if algorithm == "sac" else TD3
        algo = ref.build(cls, ref.mock_env(action_size=2), init_temperature=0.5)
        state = algo.checkpoint_state
        ref.perturb(state["target_critic"], 0.3, seed=1)
        batch = _box_batch()
        noise = ref.clone(algo._random).normal([8, 2]).numpy().astype(np.float64)
        critic = ref.twin_q_weights(state["critic"])
        target_critic = ref.twin_q_weights(state["target_critic"])
        if algorithm == "sac":
            y = ref.sac_target(ref.gaussian_actor_weights(state["policy"]), target_critic,
                               float(state["log_temperature"].numpy()), batch, noise)
        else:
            ref.perturb(state["target_policy"], 0.3, seed=2)
            config = algo._config
            y = ref.td3_target(ref.deterministic_actor_weights(state["target_policy"]),
                               target_critic, batch, noise, config.target_noise,
                               config.target_noise_clip)
        want = np.abs(ref.twin_q(critic, batch["observ"], batch["action"]) - y).mean(0)
    assert (batch["discount"] == 0).any()
    networks = [variable.numpy() for variable in algo.actor.variables]
    got = algo.actor.critic.td_error(
        {key: tf.constant(value) for key, value in batch.items()}).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for before, variable in zip(networks, algo.actor.variables, strict=True):
        np.testing.assert_array_equal(before, variable.numpy())


def test_inserted_td_errors_set_the_first_priorities_and_raise_the_largest():
    """`ReplayMemory.insert(td_error=...)`: each row's priority is (|delta| + epsilon)^alpha
    (Schaul et al. 2016, sec. 3.3), the running largest priority rises to theirs, and
    transitions inserted without TD errors get that largest one; past the capacity the
    last ones are kept with their own priorities."""
    alpha, epsilon = 0.6, 0.01
    memory = ReplayMemory(((2,), tf.float32), ((), tf.int32), 8, 1,
                          prioritized={"alpha": alpha, "epsilon": epsilon})

    def transitions(count, start):
        observ = np.arange(start, start + count, dtype=np.float32)[:, None].repeat(2, 1)
        return {"observ": observ, "nextob": observ, "action": np.zeros(count, np.int32),
                "reward": np.zeros(count, np.float32),
                "discount": np.ones(count, np.float32)}

    errors = np.array([0.5, -3.0, 0.0, 2.0, -0.1], np.float32)
    memory.insert(transitions(5, 0), td_error=errors)
    priority = (np.abs(errors) + epsilon) ** alpha
    np.testing.assert_allclose(memory.priorities.get(tf.range(5)).numpy(), priority, rtol=1e-5)
    np.testing.assert_allclose(memory._max_priority.numpy(), max(1.0, priority.max()),
                               rtol=1e-6)
    memory.insert(transitions(2, 5))  # Without errors: the largest so far.
    np.testing.assert_allclose(memory.priorities.get(tf.constant([5, 6])).numpy(),
                               [priority.max()] * 2, rtol=1e-6)
    errors = np.linspace(-5, 5, 10).astype(np.float32)
    memory.insert(transitions(10, 7), td_error=errors)  # Rows 7, 0, ..., 7 again: last 8.
    rows = (7 + np.arange(10)) % 8
    stored = memory.storage["observ"].numpy()[rows[-8:], 0]
    np.testing.assert_array_equal(stored, np.arange(9, 17))
    np.testing.assert_allclose(memory.priorities.get(tf.constant(rows[-8:])).numpy(),
                               (np.abs(errors[-8:]) + epsilon) ** alpha, rtol=1e-5)
    np.testing.assert_allclose(memory.priorities.get(tf.constant([8])).numpy(), [0.0])


def test_each_agent_explores_with_its_own_epsilon():
    """`apex_epsilon`: agent i of N takes 0.4^(1 + 7 i / (N - 1)) (Horgan et al. 2018, sec.
    4.1), with `first` and `explorers` placing an actor's agents among all actors'; the
    share of actions that differ from the greedy one is epsilon (1 - 1 / actions)."""
    spec = exploration_lib.parse({"type": "apex_epsilon"}, discrete=True)
    np.testing.assert_allclose(exploration_lib.apex_epsilons(spec, 8),
                               [0.4 ** (1 + 7 * i / 7) for i in range(8)], rtol=1e-6)
    np.testing.assert_allclose(exploration_lib.apex_epsilons(spec, 1), [0.4])
    second = dict(spec, first=4, explorers=8)  # Actor 1 of 2, 4 agents each.
    np.testing.assert_allclose(exploration_lib.apex_epsilons(second, 4),
                               [0.4 ** (1 + i) for i in range(4, 8)], rtol=1e-6)
    config = configs.load("minatar_breakout_apex", {"actors": 2, "envs_per_actor": 4})
    assert actor_lib.actor_config(config, 1).exploration == dict(
        config.exploration, first=4, explorers=8)
    actions, draws = 4, 20000
    explore = exploration_lib.Exploration(dict(spec, epsilon=0.8, alpha=3.0), 4, (), actions)
    greedy = tf.zeros([draws * 4], tf.int32)
    agents = tf.tile(tf.range(4), [draws])
    chosen = explore(agents, greedy, tf.constant(0, tf.int64),
                     tf.random.Generator.from_seed(0)).numpy().reshape(draws, 4)
    share = (chosen != 0).mean(0)
    want = 0.8 ** (1 + 3 * np.arange(4) / 3) * (1 - 1 / actions)
    np.testing.assert_allclose(share, want, atol=0.01)
    with pytest.raises(ValueError, match="epsilon must be in"):
        exploration_lib.parse({"type": "apex_epsilon", "epsilon": 2}, discrete=True)


AGENTS, LENGTH, N_STEP, RECORDINGS = 3, 5, 3, 4


def _dqn(**overrides):
    settings = {"n_step": N_STEP, "discount": 0.9, "replay_capacity": 500,
                "learning_starts": 10 ** 6, "exploration": {"type": "none"}, **overrides}
    algo = ref.build(DQN, ref.mock_env(count=AGENTS, num_actions=3, truncate=(0, 2)),
                     **settings)
    ref.perturb(algo.checkpoint_state["policy"], 1.0, seed=5)  # Greedy actions vary.
    return algo


@pytest.mark.parametrize("n_step", [N_STEP, 1])
def test_a_recording_holds_the_transitions_its_steps_completed(n_step):
    """Four recordings of 5 steps by a greedy DQN: their transitions, one after the other,
    are the rows a DQN of the same weights stores in its replay memory from 20 steps of
    the same environments in one process (windows run on across recordings;
    episodes of 2-7 steps end inside them, agents 0's and 2's by truncation); each recording's TD
    errors are the NumPy |Q(s, a) - y| of its transitions (the target network differs),
    though DQN's recorder computes them from the Q values it acted with
    (`ActingValues`); its rewards and ends are the steps'."""
    in_process = _dqn(n_step=n_step)
    steps = tf.function(lambda: simulate_steps(in_process._batch_env, in_process,
                                               RECORDINGS * LENGTH, False, False))
    episode_state(in_process._batch_env)
    steps()
    memory = in_process.memory
    count = int(memory.size.numpy())
    rows = {key: memory._ring.gather(tf.range(count))[key].numpy() for key in FIELDS}

    actor = _dqn(n_step=n_step)
    ref.perturb(actor.checkpoint_state["target_policy"], 0.5, seed=1)
    recorder = TransitionRecorder(actor._batch_env, actor.actor, LENGTH, n_step, 0.9)
    assert recorder._values is not None
    recordings = [recorder.record() for _ in range(RECORDINGS)]
    got = {key: np.concatenate([r["transitions"][key] for r in recordings]) for key in FIELDS}
    assert count == len(got["reward"]) and count >= RECORDINGS * AGENTS * (LENGTH - n_step)
    discounts = got["discount"]
    assert (discounts == 0).any() and (discounts == 0.9 ** n_step).any()
    if n_step > 1:  # Truncated windows bootstrap after fewer steps.
        assert ((discounts > 0) & (discounts > 0.9 ** n_step)).any()
    for key in FIELDS:
        np.testing.assert_allclose(got[key], rows[key], rtol=1e-6, err_msg=key)
    state = actor.checkpoint_state
    q, target = (ref.q_network_weights(state[key]) for key in ("policy", "target_policy"))
    for recording in recordings:
        batch = {key: value.astype(np.float64) for key, value in
                 recording["transitions"].items()}
        y, *_ = ref.dqn_target(q, target, batch, np.ones((len(batch["reward"]), 3), bool),
                               True)
        picked = ref.q_network(q, batch["observ"])[np.arange(len(y)),
                                                   recording["transitions"]["action"]]
        np.testing.assert_allclose(recording["td_error"], np.abs(picked - y), rtol=1e-4,
                                   atol=1e-5)
        assert recording["reward"].shape == (AGENTS, LENGTH)
        np.testing.assert_array_equal(recording["length"], [LENGTH] * AGENTS)
        assert recording["done"].any()


def _apex_config(**overrides):
    return configs.load("cartpole_apex", {
        "value_layers": [8], "envs_per_actor": 2, "rollout_length": 10, "num_agents": 2,
        "batch_size": 16, "learning_starts": 1, "jit_update": False, **overrides})


class InProcessPool:
    """Stands in for `pool.ActorPool`: one in-process Ape-X actor that always acts with the
    newest weights published."""

    def __init__(self, config):
        self.actor = actor_lib.TransitionActor(config, 0)
        self.agents = self.actor.build()["agents"]
        self.published = []
        self.recordings = []  # What the actor returned, in order.
        self.restarts, self.discarded = [0], 0

    def publish(self, version, weights):
        self.published.append((version, weights))

    def next(self):
        version, weights = self.published[-1]
        result = self.actor.collect(version, weights)
        self.recordings.append(result["fragment"])
        return Fragment(0, result["version"], result["fragment"], result["scores"],
                        result["lengths"], result["seconds"], 1)


def test_the_learner_holds_the_replay_ratio_and_broadcasts_every_so_many_updates(tmp_path):
    """6 recordings of 2 x 10 steps at 0.5 updates per step: 10 updates each (60 in all,
    the version), the weights published at the start and whenever 16 more updates were
    made, the actor acting with the learner's step and weights; `apex/replay_ratio` is
    0.5 and the version is kept. (The first priorities stored: the test below.)"""
    steps = 6 * 2 * 10
    config = _apex_config(steps=steps, eval_every=steps, log_every=40, eval_episodes=0,
                          broadcast_every=16)
    built = build.build(config, environments.create_batch(config))
    pool = InProcessPool(config)
    loop = ApexLoop(tmp_path, *built, pool=pool, broadcast_every=16, max_policy_lag=None,
                    steps=steps, eval_every=steps, eval_episodes=0, log_every=40,
                    progress=False)
    loop.run()
    assert loop.version == 60 == int(built.algo.updates.numpy())
    assert int(built.step.numpy()) == steps
    assert [version for version, _ in pool.published] == [0, 20, 40, 50]  # 16, 32, 48 crossed.
    size = int(built.algo.memory.size.numpy())
    assert 6 * 2 * (10 - 2) <= size <= steps  # 3-step windows: the last 2 steps wait.
    ratios = _scalars(tmp_path / "train", "apex/replay_ratio")
    assert ratios and np.allclose(ratios, 0.5)
    assert _scalars(tmp_path / "train", "dqn/loss"), "the updates' summaries"
    # The actor acted last with the weights of version 50, the learner's step then 100.
    acting = pool.actor._actor
    _, weights = pool.published[-1]
    for got, want in zip(acting.variables, weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    assert int(acting.variables[-1].numpy()) == 100  # The step.
    restored = tf.train.Checkpoint(policy_version=tf.Variable(0, dtype=tf.int64))
    restored.read(loop.manager.latest_checkpoint).expect_partial()
    assert int(restored.policy_version.numpy()) == 60


ALPHA, EPSILON = 0.6, 0.01  # Prioritized replay's settings in the runs below.


def _stored(memory):
    """The rows of a replay memory, in order: dict of NumPy arrays of `FIELDS`."""
    rows = memory._ring.gather(tf.range(int(memory.size.numpy())))
    return {key: rows[key].numpy() for key in FIELDS}


@pytest.fixture(scope="module")
def dqn_apex_run(tmp_path_factory):
    """An Ape-X DQN run of 3 recordings of 2 x 10 steps that makes no update
    (`learning_starts` out of reach), the learner's target network perturbed away from its
    online one before the first broadcast, epsilon falling over the first 40 steps:
    `(algo, weights, recordings, pool)`, the learner's algorithm, the NumPy weights of its
    online and target networks as broadcast (`policy`, `target_policy`), the recordings
    its actor returned, and the pool (`InProcessPool`)."""
    steps = 3 * 2 * 10
    config = _apex_config(steps=steps, eval_every=steps, log_every=steps, eval_episodes=0,
                          learning_starts=10 ** 6, prioritized_replay={
                              "alpha": ALPHA, "beta": 0.4, "epsilon": EPSILON},
                          exploration=EPSILON_DECAY)
    built = build.build(config, environments.create_batch(config))
    state = built.algo.checkpoint_state
    ref.perturb(state["target_policy"], 0.5, seed=1)
    weights = {key: ref.q_network_weights(state[key]) for key in ("policy", "target_policy")}
    pool = InProcessPool(config)
    loop = ApexLoop(tmp_path_factory.mktemp("apex"), *built, pool=pool, broadcast_every=16,
                    max_policy_lag=None, steps=steps, eval_every=steps, eval_episodes=0,
                    log_every=steps, progress=False)
    loop.run()
    assert len(pool.recordings) == 3 and loop.version == 0
    return built.algo, weights, pool.recordings, pool


EPSILON_DECAY = {"type": "epsilon_decay", "initial": 1.0, "final": 0.05, "steps": 40}


def test_actors_take_the_learners_step_before_its_first_update(dqn_apex_run):
    """Before `learning_starts` the version stays 0, yet the learner publishes after every
    recording (the global step moved on), and the actor acts with the newest: its third
    recording with the step after the second, 40, where epsilon_decay's schedule reaches
    0.05 (so the actors explore as the learner's step says, not at 1.0 until the first
    update)."""
    _, _, _, pool = dqn_apex_run
    assert [(version, int(weights[-1])) for version, weights in pool.published] == [
        (0, 0), (0, 20), (0, 40), (0, 60)]
    step = int(pool.actor._actor.step.numpy())
    assert step == 40
    spec = exploration_lib.parse(EPSILON_DECAY, discrete=True)
    assert float(exploration_lib.epsilon(spec, step)) == pytest.approx(0.05)


def test_the_learner_stores_each_transition_with_its_actors_first_priority(dqn_apex_run):
    """`ApexLoop` through `OffPolicyAlgorithm.learn`: the learner's prioritized memory holds the
    actor's transitions, each (matched by its observations and action) with the priority
    (|delta| + epsilon)^alpha of the TD error delta the actor computed for it (Horgan et
    al. 2018, algorithm 2; Schaul et al. 2016, sec. 3.3), computed here from the
    recordings. Catches: the actors' TD errors dropped on the way (every transition
    inserted at the largest priority so far)."""
    algo, _, recordings, _ = dqn_apex_run
    sent = {}
    for recording in recordings:
        transitions = recording["transitions"]
        for index, error in enumerate(recording["td_error"]):
            key = (transitions["observ"][index].tobytes(), int(transitions["action"][index]),
                   transitions["nextob"][index].tobytes())
            sent[key] = (error, transitions["reward"][index], transitions["discount"][index])
    assert len(sent) == sum(len(recording["td_error"]) for recording in recordings) > 40
    rows = _stored(algo.memory)
    assert len(rows["reward"]) == len(sent)
    want = []
    for index in range(len(rows["reward"])):
        key = (rows["observ"][index].tobytes(), int(rows["action"][index]),
               rows["nextob"][index].tobytes())
        assert key in sent, f"row {index} is none of the actor's transitions"
        error, reward, discount = sent.pop(key)
        assert (rows["reward"][index], rows["discount"][index]) == (reward, discount)
        want.append((abs(float(error)) + EPSILON) ** ALPHA)
    want = np.array(want)
    assert want.max() - want.min() > 0.1  # Unequal: the largest one would not pass.
    got = algo.memory.priorities.get(tf.range(len(want))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_actor_computes_its_td_errors_with_the_learners_target_network(dqn_apex_run):
    """The actor's first priorities come from the networks the learner broadcast, its
    target network included (perturbed away from the online one, and from the actor's
    own initial weights): each recording's TD errors are the NumPy |Q(s, a) - y| with
    y = R + gamma_k Q'(s', argmax_a Q(s', a)) of the learner's Q and Q' (double Q-learning,
    van Hasselt et al. 2016). Catches: the acting half's weights without the target network
    (the actor keeps its own); the actor's TD error with its online network as the target."""
    _, weights, recordings, _ = dqn_apex_run
    q, target = weights["policy"], weights["target_policy"]
    for recording in recordings:
        batch = {key: value.astype(np.float64)
                 for key, value in recording["transitions"].items()}
        action = recording["transitions"]["action"]
        count, allowed = len(action), np.ones((len(action), 2), bool)
        y, *_ = ref.dqn_target(q, target, batch, allowed, True)
        taken = ref.q_network(q, batch["observ"])[np.arange(count), action]
        np.testing.assert_allclose(recording["td_error"], np.abs(taken - y), rtol=1e-4,
                                   atol=1e-5)
        online_y, *_ = ref.dqn_target(q, q, batch, allowed, True)
        bootstraps = batch["discount"] > 0
        assert bootstraps.any() and np.abs(online_y - y)[bootstraps].max() > 0.1


@pytest.mark.parametrize("algorithm", ["sac", "td3"])
def test_sac_and_td3_learners_learn_from_their_actors_transitions(algorithm, tmp_path):
    """The same machinery for Box actions (Ape-X DPG in the paper): an actor of Pendulum
    records 3 x 16 transitions; the learner's memory holds exactly those, in the order
    they came, and its 48 updates on them moved its critics toward their targets: the
    critics' mean squared error (NumPy) on every stored transition against the targets y
    of the learner's initial networks (`ref.sac_target`, `ref.td3_target`; fixed noise)
    fell below half of what it was (to about 0.1-0.15 of it; 0.8-0.95 with the sampled
    batches' rewards zeroed). Catches: a learner storing other transitions than
    the actor's (zeros, the reward dropped: the memory's rows); one updating on its
    batches without their rewards (the critics' error)."""
    keras.utils.set_random_seed(0)
    steps = 3 * 2 * 8
    config = configs.load("pendulum_sac", {
        "algorithm": algorithm, "actors": 1, "envs_per_actor": 2, "rollout_length": 8,
        "num_agents": 2, "policy_layers": [8], "value_layers": [8], "batch_size": 8,
        "value_lr": 0.03, "learning_starts": 1, "steps": steps, "eval_every": steps,
        "eval_episodes": 0, "prioritized_replay": {"alpha": ALPHA, "beta": 0.4},
        "jit_update": False})
    built = build.build(config, environments.create_batch(config))
    algo = built.algo
    state = algo.checkpoint_state
    critic = ref.twin_q_weights(state["critic"])
    target_critic = ref.twin_q_weights(state["target_critic"])
    if algorithm == "sac":
        policy = ref.gaussian_actor_weights(state["policy"])
        log_alpha = float(state["log_temperature"].numpy())
    else:
        policy = ref.deterministic_actor_weights(state["target_policy"])
    pool = InProcessPool(config)
    loop = ApexLoop(tmp_path, *built, pool=pool, broadcast_every=1, max_policy_lag=None,
                    steps=steps, eval_every=steps, eval_episodes=0, log_every=16,
                    progress=False)
    loop.run()
    assert loop.version == int(algo.updates.numpy()) == steps  # One per step, from the 1st.
    rows = _stored(algo.memory)
    assert len(pool.recordings) == 3
    for key in FIELDS:
        sent = np.concatenate([recording["transitions"][key] for recording in pool.recordings])
        np.testing.assert_array_equal(rows[key], sent, err_msg=key)
    batch = {key: value.astype(np.float64) for key, value in rows.items()}
    assert len(batch["reward"]) == steps and (batch["reward"] < -0.5).all()
    noise = np.random.default_rng(0).normal(size=batch["action"].shape)
    if algorithm == "sac":
        y = ref.sac_target(policy, target_critic, log_alpha, batch, noise)
    else:
        y = ref.td3_target(policy, target_critic, batch, noise, algo._config.target_noise,
                           algo._config.target_noise_clip)

    def error(weights):
        return np.mean((ref.twin_q(weights, batch["observ"], batch["action"]) - y) ** 2)

    before, after = error(critic), error(ref.twin_q_weights(state["critic"]))
    assert after < 0.5 * before


@pytest.mark.parametrize("algorithm", ["dqn", "sac", "td3"])
def test_an_ape_x_actor_builds_its_acting_half_alone(algorithm, optimizers_made, monkeypatch):
    """An Ape-X actor builds the acting half with its critic (`build.acting_half`), no
    algorithm: no Keras optimizer and no replay memory are made while it builds and
    records, and it gives TD errors; the learner's acting half has the same variables
    (`get_weights` goes from one to the other) and the learner made the optimizers."""
    made = optimizers_made
    memories = []
    init = ReplayMemory.__init__

    def counting_init(self, *args, **kwargs):
        memories.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(ReplayMemory, "__init__", counting_init)
    config = (_apex_config() if algorithm == "dqn" else configs.load(
        "pendulum_sac", {"algorithm": algorithm, "actors": 1, "envs_per_actor": 2,
                         "rollout_length": 4, "policy_layers": [8], "value_layers": [8]}))
    actor = actor_lib.TransitionActor(config, 0)
    actor.build()
    assert actor.collect()["fragment"]["td_error"].size > 0
    assert made == [] and memories == []
    acting = actor._actor
    assert type(acting) is build.ALGORITHMS[algorithm].actor_class
    learner = build.build(config, environments.create_batch(config)).algo
    assert made and all(name == "Adam" for name in made) and len(memories) == 1
    acting.set_weights(learner.actor.get_weights())
    for got, want in zip(acting.variables, learner.actor.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
