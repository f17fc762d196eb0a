"""An actor's fragments (`batchrl.distributed.fragment`): they hold the steps as the agents
took them, and with one actor that always has the learner's newest weights (no policy lag),
learning from them is exactly the in-process `impala`'s learning."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, configs
from batchrl.algorithms import APPO, IMPALA
from batchrl.algorithms.actor import OnPolicyActor
from batchrl.algorithms.fragment_learning import by_return
from batchrl.distributed.fragment import FragmentRecorder, compact, expand
from batchrl.drivers.simulate import episode_state, simulate_steps
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.networks import feed_forward_categorical, feed_forward_gaussian, recurrent_gaussian

AGENTS, LENGTH, FRAGMENTS = 3, 6, 4


def _config(network=feed_forward_gaussian, **overrides):
    config = configs.load("default", {
        "algorithm": "impala", "policy_layers": [16], "value_layers": [16],
        "rollout_length": LENGTH, "discount": 0.9, "gae_lambda": 1.0, "policy_lr": 0.01,
        "normalize_observ": False, "normalize_reward": False, "network": network.__name__,
        **overrides})
    config.update(network=network, max_length=50)
    return config


def _batch_env(num_actions=None):
    """Mock environments whose episodes (2 to 5 steps: several end inside a fragment) are
    the same in every call: each is seeded by its index; `Box` actions `(2,)`, or with
    `num_actions` `Discrete` ones."""
    shape = (2,) if num_actions is None else ()
    envs = [MockEnvironment((3,), shape, 2, 5, num_actions=num_actions)
            for _ in range(AGENTS)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    return InGraphBatchEnv(BatchEnv(envs, blocking=True))


def _algorithm(config, algorithm_class=IMPALA, num_actions=None):
    tf.keras.utils.set_random_seed(0)  # The same initial weights in every call.
    return algorithm_class(_batch_env(num_actions), tf.Variable(0, dtype=tf.int64),
                           tf.Variable(True), tf.Variable(False), config)


def _recorder(config, batch_env=None, actor_class=OnPolicyActor, num_actions=None):
    """`(recorder, actor, batch_env)`; the recorder records the discounted returns for
    `reward_normalizer: return`, as `FragmentActor`'s does."""
    batch_env = batch_env or _batch_env(num_actions)
    actor = actor_class(batch_env.observation_space, batch_env.action_space, config,
                        num_agents=len(batch_env))
    return (FragmentRecorder(batch_env, actor, LENGTH,
                             config.discount if by_return(config) else None),
            actor, batch_env)


def test_a_fragment_holds_the_steps_as_the_agents_took_them():
    """Row b, step t: the observation acted on is the one after step t - 1, or the first
    of a new episode where step t - 1 ended one; the reward and the end flags are the
    environment's; the stored parameters are those the action was drawn from; and the
    next fragment continues where this one stopped."""
    recorder, actor, batch_env = _recorder(_config())
    first, second = recorder.record(), recorder.record()
    np.testing.assert_array_equal(first["length"], [LENGTH] * AGENTS)
    assert first["done"].any() and first["terminated"].any()
    for fragment in (first, second):
        for row in range(AGENTS):
            for t in range(1, LENGTH):
                if not fragment["done"][row, t - 1]:
                    np.testing.assert_array_equal(fragment["observ"][row, t],
                                                  fragment["next_observ"][row, t - 1])
    ongoing = ~first["done"][:, -1]
    np.testing.assert_array_equal(second["observ"][ongoing, 0],
                                  first["next_observ"][ongoing, -1])
    # The environments' own record: each took every step, and ended as many episodes (those
    # that lasted their planned duration) as its row's `done` says.
    for row, env in enumerate(batch_env._batch_env._envs):
        assert sum(env.steps) == 2 * LENGTH
        ended = sum(steps == duration for steps, duration in zip(env.steps, env.durations,
                                                                   strict=True))
        assert ended == first["done"][row].sum() + second["done"][row].sum()
    params, _ = actor.networks.policy(first["observ"], tf.zeros([AGENTS, 0]))
    np.testing.assert_allclose(first["policy_mean"], params["mean"].numpy(), rtol=1e-5,
                               atol=1e-6)
    assert np.abs(first["action"] - first["policy_mean"]).max() > 0, "actions are sampled"


@pytest.mark.parametrize("algorithm, network, fragments", [
    ("impala", feed_forward_gaussian, FRAGMENTS), ("impala", recurrent_gaussian, FRAGMENTS),
    ("a2c", feed_forward_gaussian, FRAGMENTS), ("trpo", feed_forward_gaussian, FRAGMENTS),
    # PPO and PQN shuffle their minibatches with the generator that also samples their
    # actions in one process: from the second rollout on, the actor (which only samples)
    # draws others. (Their one rollout here is one full batch: its order does not matter.)
    ("ppo", feed_forward_gaussian, 1), ("pqn", feed_forward_categorical, 1),
    # The rewards scaled by the std of the agents' discounted returns, which run on across
    # fragments in the actor (`return`) as across rollouts in one process.
    ("impala-return", feed_forward_gaussian, FRAGMENTS)])
def test_one_actor_without_lag_learns_as_the_algorithm_in_one_process(
        algorithm, network, fragments):
    """The learner builds its batch from fragments as the in-process algorithm builds it
    from its memory of rollouts (`rollout_length`), and `update` is the same function:
    with the learner's weights copied into the actor before every fragment (policy lag 0),
    both end with the same weights, to float32 rounding; a recurrent policy's states run on
    across fragments and rows on both sides. Every on-policy algorithm that reads
    `rollout_length` learns so, those of `build_algorithm` (a2c, trpo) and PQN (which acts
    epsilon-greedily on Discrete actions) included."""
    discrete = network is feed_forward_categorical
    num_actions = 3 if discrete else None
    algorithm, _, normalizer = algorithm.partition("-")
    scaled = {"normalize_reward": True, "reward_normalizer": "return"} if normalizer else {}
    config = _config(network, algorithm=algorithm, update_epochs=2, **scaled)
    algorithm_class = build.ALGORITHMS[algorithm]
    assert algorithm_class.actors == "fragments"
    in_process = _algorithm(config, algorithm_class, num_actions)

    @tf.function(autograph=False)
    def run():
        return simulate_steps(in_process._batch_env, in_process, LENGTH * fragments,
                              False, False)

    episode_state(in_process._batch_env)
    run()

    learner = _algorithm(config, algorithm_class, num_actions)
    recorder, actor, _ = _recorder(config, actor_class=algorithm_class.actor_class,
                                   num_actions=num_actions)
    initial = learner.actor.get_weights()
    for _ in range(fragments):
        actor.set_weights(learner.actor.get_weights())
        learner.learn(expand(recorder.collect()))
    changed = False
    for got, want, start in zip(learner.actor.get_weights(), in_process.actor.get_weights(),
                                initial, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        changed |= not np.allclose(got, start)
    assert changed, "the updates changed the policy"


def test_a_recurrent_policys_states_run_on_across_fragments_and_reset_at_episodes():
    """Each step's stored state is the one its action was taken in: zero at an episode's
    first step (the first step of all included), else the GRU's state after the step
    before, across the fragments' boundaries; the stored parameters are the policy's from
    that state."""
    config = _config(recurrent_gaussian)
    recorder, actor, _ = _recorder(config)
    fragments = [recorder.record() for _ in range(2)]
    joined = {key: np.concatenate([fragment[key] for fragment in fragments], axis=1)
              for key in ("observ", "state", "done", "policy_mean")}
    size = actor.networks.policy.state_size
    assert joined["state"].shape == (AGENTS, 2 * LENGTH, size)
    assert joined["done"][:, :-1].any()
    policy = actor.networks.policy
    for row in range(AGENTS):
        for t in range(2 * LENGTH):
            state = joined["state"][row, t]
            if t == 0 or joined["done"][row, t - 1]:
                np.testing.assert_array_equal(state, np.zeros(size))
            else:
                _, after = policy(joined["observ"][row, t - 1][None, None],
                                  joined["state"][row, t - 1][None])
                np.testing.assert_allclose(state, after.numpy()[0], rtol=1e-5, atol=1e-6)
            params, _ = policy(joined["observ"][row, t][None, None], state[None])
            np.testing.assert_allclose(joined["policy_mean"][row, t],
                                       params["mean"].numpy()[0, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("replay", ["unroll", "stepwise"])
@pytest.mark.parametrize("learner_class", [IMPALA, APPO])
def test_a_recurrent_policy_replayed_from_its_stored_states_acts_as_it_acted(
        learner_class, replay):
    """Unrolled over each row from its first stored state, reset where episodes begin
    inside it (`unrolled_policy`), or replayed step by step from the stored states
    (`stepwise_policy`), the learner's policy with the actor's weights gives the behaviour
    policy's probabilities: the importance weights pi / mu at the update's start are 1.
    (Fragments of 6 steps of episodes of 2 to 5: episodes begin inside the rows.)"""
    config = _config(recurrent_gaussian, recurrent_replay=replay)
    recorder, actor, _ = _recorder(config)
    recorder.record()  # The next fragment starts from states carried over.
    learner = _algorithm(config, learner_class)
    actor.set_weights(learner.actor.get_weights())
    result = learner.learn(expand(recorder.collect()))
    assert float(result["mean_rho"]) == pytest.approx(1.0, abs=1e-5)
    assert result["updates"] == 1


def test_an_algorithm_that_does_not_learn_from_actors_says_so():
    """`learn` is the one way into learning from actors; an on-policy algorithm that does
    not read `rollout_length` (it learns from whole episodes only) declares no actors and
    refuses a fragment in one line naming itself."""
    from batchrl.algorithms import PPO

    class Episodes(PPO):
        config_keys = PPO.config_keys - {"rollout_length"}

    assert Episodes.actors is None and PPO.actors == "fragments"
    config = _config()
    fragment = expand(_recorder(config)[0].collect())
    episodes = _algorithm(configs.Config(config, update_epochs=1, rollout_length=None),
                          Episodes)
    with pytest.raises(NotImplementedError, match="^Episodes does not learn from actors'"):
        episodes.learn(fragment)


def test_the_learner_bootstraps_with_the_value_of_the_observation_after_each_step(
        monkeypatch):
    """The learner's batch holds, for each step of a fragment, V of the observation after
    it (the final one where the step ended an episode, the one after the row's cut at its
    end), as the value network gives it on the recorded `next_observ` here, not V of the
    next step's observation (a new episode's first)."""
    config = _config()
    learner = _algorithm(config)
    recorder, _, _ = _recorder(config)
    fragment = expand(recorder.collect())
    inner_done = fragment["done"][:, :-1]
    assert inner_done.any(), "an episode ends inside the fragment"
    monkeypatch.setattr(learner, "update", lambda batch: batch)
    batch = learner._fragment_update(fragment)
    want = learner.networks.value(fragment["next_observ"].astype(np.float32)).numpy()
    np.testing.assert_allclose(batch["next_value"].numpy(), want, rtol=1e-5, atol=1e-6)
    value = batch["value"].numpy()
    assert np.all(np.abs(want[:, :-1] - value[:, 1:])[inner_done] > 1e-4)


def test_the_learner_normalizes_with_its_statistics_then_updates_them():
    config = _config(normalize_observ=True, normalize_reward=True)
    learner = _algorithm(config)
    recorder, _, _ = _recorder(config)
    fragment = expand(recorder.collect())
    learner.learn(fragment)
    observ = fragment["observ"].reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(learner._observ_filter.mean.numpy(), observ.mean(0),
                               rtol=1e-5, atol=1e-6)


def test_with_the_return_normalizer_a_fragment_holds_each_agents_discounted_return():
    """`return` at row b, step t is the agent's discounted return of its episode so far,
    `G_t = discount G_{t-1} + r_t`, zero before an episode's first step, running on across
    fragments (a NumPy recursion over the recorded rewards and ends); without the
    normalizer there is no such field."""
    recorder, _, _ = _recorder(_config(normalize_reward=True, reward_normalizer="return"))
    fragments = [recorder.record() for _ in range(3)]
    reward = np.concatenate([fragment["reward"] for fragment in fragments], 1)
    done = np.concatenate([fragment["done"] for fragment in fragments], 1)
    want, running = np.zeros_like(reward), np.zeros(AGENTS)
    for t in range(reward.shape[1]):
        running = 0.9 * running + reward[:, t]  # _config's discount.
        want[:, t] = running
        running = np.where(done[:, t], 0.0, running)
    got = np.concatenate([fragment["return"] for fragment in fragments], 1)
    assert done[:, :-1].any() and (got != reward).any()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert "return" not in _recorder(_config())[0].record()


def test_a_fragment_travels_with_each_observation_once():
    """`compact` keeps each observation once: the row's observations, then the one after
    its last step, plus the final observations of episodes that ended before it; `expand`
    gives back the recording on every valid step (rows of fewer steps included)."""
    rng = np.random.default_rng(1)
    rows, steps = 3, 5
    observ = rng.integers(0, 255, (rows, steps, 2, 2), dtype=np.uint8)
    next_observ = np.concatenate([observ[:, 1:], rng.integers(
        0, 255, (rows, 1, 2, 2), dtype=np.uint8)], axis=1)
    done = np.zeros((rows, steps), bool)
    done[0, 1] = done[1, 4] = done[2, 0] = True  # Row 1 ends at its last step.
    next_observ[done] = rng.integers(0, 255, (done.sum(), 2, 2), dtype=np.uint8)
    length = np.array([5, 5, 3], np.int32)  # Row 2 left out of its last two steps.
    recorded = {"observ": observ, "next_observ": next_observ, "done": done,
                "length": length, "reward": rng.normal(size=(rows, steps))}
    sent = compact(recorded)
    assert "next_observ" not in sent and sent["observ"].shape == (rows, steps + 1, 2, 2)
    assert sent["final_step"].tolist() == [[0, 1], [2, 0]]  # Not row 1's last step.
    back = expand(sent)
    valid = np.arange(steps)[None] < length[:, None]
    for key in ("observ", "next_observ"):
        np.testing.assert_array_equal(back[key][valid], recorded[key][valid])
    np.testing.assert_array_equal(back["reward"], recorded["reward"])


@pytest.mark.parametrize("name", ["image_and_cue", "reach_and_choose"])
def test_nested_observations_and_actions_travel_in_fragments_and_train_appo(
        name, monkeypatch):
    """An actor of the Dict-observation task (an image and a cue, a layer list per entry)
    and of the Dict-action one (a Box and a Discrete leaf) records fragments whose
    observations and actions are the flattened entries `InGraphBatchEnv` gives, and
    `appo`'s learner, built as `train` builds it, learns from them; `close` stops the
    actor's environments."""
    from batchrl import build, environments
    from batchrl.distributed.actor import FragmentActor

    # PPO's keys of the configs that appo does not read back to their defaults.
    config = configs.load(name, {
        "algorithm": "appo", "rollout_length": 5, "actors": 1, "envs_per_actor": 3,
        "num_agents": 1, "batch_size": None, "chunk_length": None,
        "value_lr": configs.load("default").value_lr})
    build.check(config)
    actor = FragmentActor(config, 0)
    described = actor.build()
    fragment = expand(actor.collect(0, None)["fragment"])
    assert fragment["observ"].shape == (3, 5, *described["observ_shape"])
    assert fragment["action"].shape == (3, 5, *described["action_shape"])
    learner = build.build(configs.Config(config, actors=0),
                          environments.create_batch(configs.Config(config, actors=0)))
    before = [weight.copy() for weight in learner.algo.actor.get_weights()]
    result = learner.algo.learn(fragment)
    assert np.isfinite(float(result["loss"]))
    assert any(not np.allclose(a, b) for a, b in zip(
        before, learner.algo.actor.get_weights(), strict=True))
    closed = []
    close = actor._batch_env.close
    monkeypatch.setattr(actor._batch_env, "close", lambda: closed.append(close()))
    actor.close()
    assert len(closed) == 1
    learner.batch_env.close()


@pytest.mark.parametrize("algorithm", ["impala", "ppo"])
def test_learn_traced_ahead_changes_nothing_and_is_the_function_fragments_call(algorithm):
    """`trace_learn` (run while the actors start) traces `learn`'s function for the
    fragments' shapes without running it; the first fragment then runs that trace."""
    config = _config(algorithm=algorithm)
    learner = _algorithm(config, build.ALGORITHMS[algorithm])
    before = learner.actor.get_weights()
    learner.trace_learn(AGENTS)
    assert learner._learn_and_log.experimental_get_tracing_count() == 1
    for got, want in zip(learner.actor.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)
    recorder, _, _ = _recorder(config)
    learner.learn(expand(recorder.collect()))
    assert learner._learn_and_log.experimental_get_tracing_count() == 1
