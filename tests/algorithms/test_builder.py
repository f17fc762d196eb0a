"""`build_algorithm`, TRPO and A2C inside `simulate`, on MockEnvironment batches."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl import build, configs
from batchrl.algorithms import A2C, PPO, TRPO, FunctionalAlgorithm, build_algorithm, parts
from batchrl.drivers.simulate import episode_state, simulate
from batchrl.environments.in_graph import InGraphBatchEnv
from batchrl.environments.local import BatchEnv
from batchrl.environments.mock import MockEnvironment
from batchrl.networks import feed_forward_gaussian
from batchrl.networks.distributions import DiagonalGaussian
from tests.recording_environment import RecordingEnvironment


def _setup(algorithm, durations, truncate=False, config_class=configs.Config, **overrides):
    tf.keras.utils.set_random_seed(0)  # The same initial weights in every run.
    config = config_class(configs.load("default", {
        "policy_layers": [16], "value_layers": [16], "update_every": 3, **overrides}))
    config.update(network=feed_forward_gaussian, max_length=8)
    truncates = truncate if isinstance(truncate, list) else [truncate] * len(durations)
    envs = [RecordingEnvironment((3,), (2,), low, high, truncate=cut)
            for (low, high), cut in zip(durations, truncates, strict=True)]
    for index, env in enumerate(envs):
        env.reset(seed=index)
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    algo = algorithm(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
                     tf.Variable(False), config)
    episode_state(batch_env)  # Its variables exist before the trace.

    @tf.function(input_signature=[tf.TensorSpec([], tf.bool)] * 2, autograph=False)
    def run(log, reset):
        return simulate(batch_env, algo, log, reset)

    algo.envs = envs
    return algo, run


@pytest.mark.parametrize("algorithm", [TRPO, A2C], ids=["trpo", "a2c"])
def test_trains_and_empties_its_memory_reading_the_keys_it_declares(algorithm):
    """Trains, and building it and tracing `simulate` read every key it declares in
    `config_keys` and, of the keys any algorithm declares, only those (as
    `test_declared_config_keys_are_the_keys_read` for PPO)."""
    algo, run = _setup(algorithm, [(2, 8), (3, 5), (4, 6)], config_class=_RecordingConfig,
                       lr_schedule="linear", kl_schedule="linear")
    run.get_concrete_function()
    declared = set().union(*(other.config_keys for other in build.ALGORITHMS.values()))
    assert set(algorithm.config_keys) <= algo._config.read
    assert algo._config.read & declared == set(algorithm.config_keys)
    policy = [v.numpy().copy() for v in algo.networks.policy.trainable_variables]
    value = [v.numpy().copy() for v in algo.networks.value.trainable_variables]
    episodes = 0
    for _ in range(30):
        done, score = run(False, False)
        assert np.isfinite(score.numpy()).all()
        episodes += int(done.numpy().sum())
    assert episodes >= 6, "at least two updates of 3 episodes"
    assert int(algo._memory_index.numpy()) < 3
    for before, networks in ((policy, algo.networks.policy), (value, algo.networks.value)):
        after = networks.trainable_variables
        assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, after, strict=True))
    assert run.experimental_get_tracing_count() == 1


def _recorder():
    """An algorithm whose postprocessing copies the batch into `seen` (as NumPy) and whose
    loss is 0: it trains nothing and shows what the batch holds."""
    seen = {}

    def postprocess(batch, *, discount):
        def store(*values):
            seen.update({key: value.numpy() for key, value in zip(sorted(batch), values,
                                                                  strict=True)})
            seen["discount"] = discount
            return np.float32(0)

        stored = tf.py_function(store, [batch[key] for key in sorted(batch)], tf.float32)
        return {**batch, "stored": stored}

    def loss(networks, distribution, batch):
        policy = parts.current_policy(networks, distribution, batch)
        return 0.0 * tf.reduce_sum(policy.mean)

    return build_algorithm("recorder", loss, postprocess), seen


def test_the_batch_holds_what_build_algorithm_documents():
    """The batch against what the environments returned, normalized in NumPy: each step's
    reward scaled by the standard deviation of all rewards so far (the update comes after
    the last step's rewards were added), and the bootstrap the value of the episode's
    final observation, normalized with the statistics of the observations acted on before
    its last step, or 0 for a terminated episode (the episodes of 3 and 4 steps end
    truncated, that of 5 steps terminates)."""
    algorithm, seen = _recorder()
    truncate = [True, False, True]
    algo, run = _setup(algorithm, [(3, 3), (5, 5), (4, 4)], truncate=truncate, discount=0.7)
    acted, following = [], []
    for _ in range(5):  # The episodes of 3, 4 and 5 steps end: the memory is full.
        run(False, False)
        acted.append(np.stack([env.observations[-2] for env in algo.envs]))
        following.append(np.stack([env.observations[-1] for env in algo.envs]))
    assert seen["discount"] == 0.7
    length = seen["length"]
    np.testing.assert_array_equal(length, [3, 4, 5])  # In the order they ended.
    steps = np.arange(8)[None, :]
    np.testing.assert_array_equal(seen["mask"], (steps < length[:, None]).astype(np.float32))
    np.testing.assert_array_equal(seen["done"], steps == length[:, None] - 1)
    agents = [0, 2, 1]  # The environment of each row: episodes of 3, 4 and 5 steps.
    truncated = np.array([truncate[agent] for agent in agents])
    np.testing.assert_array_equal(seen["terminated"], seen["done"] & ~truncated[:, None])
    assert seen["observ"].shape == (3, 8, 3) and seen["action"].shape == (3, 8, 2)
    assert seen["initial_state"].shape == (3, 0)
    assert not seen["reward"][seen["mask"] == 0].any()
    assert not seen["value"][seen["mask"] == 0].any()
    # `old_policy_` is the policy when the update began; nothing trained before, and the
    # policy that acted was the same: the stored parameters agree.
    valid = seen["mask"] > 0
    np.testing.assert_allclose(seen["old_policy_mean"][valid], seen["policy_mean"][valid],
                               rtol=1e-5, atol=1e-6)
    rewards = np.array([env.rewards for env in algo.envs])  # [agents, 5 steps]
    scale = np.std(rewards, ddof=1) + 1e-8
    assert abs(scale - 1.0) > 0.1, "the scaling shows"
    for row, agent in enumerate(agents):
        want = np.clip(rewards[agent, :length[row]] / scale, -10.0, 10.0)
        np.testing.assert_allclose(seen["reward"][row, :length[row]], want, rtol=1e-5)
    # The value after the last step: of the final observation when truncated, else 0.
    finals = []
    for row, agent in enumerate(agents):
        last = length[row] - 1  # The call of the episode's last step.
        before = np.concatenate(acted[:last])
        mean, std = before.mean(0), before.std(0, ddof=1)
        finals.append(np.clip((following[last][agent] - mean) / (std + 1e-8), -5.0, 5.0))
    value = algo.networks.value(np.array(finals, np.float32)[:, None])[:, 0].numpy()
    assert np.abs(value[~truncated]).min() > 1e-3, "a bootstrap of 0 shows"
    np.testing.assert_allclose(seen["bootstrap"], np.where(truncated, value, 0.0),
                               rtol=1e-5, atol=1e-6)
    first = algo.networks.value(seen["observ"][:, :1])[:, 0].numpy()
    assert np.abs(first - value).min() > 1e-3, "the first observation's value differs"


def _misspelt_loss(networks, distribution, batch, *, entropy_coeff):
    return 0.0


MISSPELT = build_algorithm("misspelt", _misspelt_loss)


def test_keywords_without_defaults_must_be_config_keys():
    def loss(networks, distribution, batch, *, entropy_coef, scale=2.0):
        return 0.0

    assert build_algorithm("k", loss).required_config_keys() == {("loss_fn", "entropy_coef")}
    config = configs.load("default", {"algorithm": "tests.algorithms.test_builder:MISSPELT"})
    with pytest.raises(configs.ConfigError,
                       match="loss_fn of 'tests.algorithms.test_builder:MISSPELT' takes the "
                             "keyword 'entropy_coeff', which is not a config key"):
        build.algorithm_class(config)


@pytest.mark.parametrize("arguments, message", [
    (("has space", lambda *a: 0.0), "algorithm name 'has space'"),
    (("x", None), "loss_fn of algorithm 'x' must be a function"),
    (("x", lambda *a: 0.0, 3), "postprocess_fn of algorithm 'x' must be a function"),
])
def test_bad_arguments_name_the_culprit(arguments, message):
    with pytest.raises(ValueError, match=message):
        build_algorithm(*arguments)


def test_a_bad_default_optimizer_is_an_error_at_once():
    with pytest.raises(ValueError, match="'optimizer' has unknown type 'adamm'"):
        build_algorithm("x", lambda *a: 0.0, optimizer={"type": "adamm"})


@pytest.mark.parametrize("overrides, message", [
    ({"algorithm": "ppo", "optimizer": {"type": "adam"}},
     "config key 'optimizer' is not read by algorithm 'ppo'"),
    ({"algorithm": "no_such_module:X"}, "cannot import module 'no_such_module'"),
    ({"algorithm": "batchrl.networks:Networks"}, "is not an algorithm class"),
])
def test_bad_algorithm_keys_name_the_culprit(overrides, message):
    with pytest.raises(configs.ConfigError, match=message):
        build.algorithm_class(configs.load("default", overrides))


@pytest.mark.parametrize("algorithm, key, value", [
    ("trpo", "update_epochs", 3), ("trpo", "chunk_length", 50), ("trpo", "batch_size", 8),
    ("trpo", "normalize_value", True), ("trpo", "kl_reference", "update_start"),
    ("trpo", "kl_schedule", "linear"), ("trpo", "kl_target", 0.05),
    ("trpo", "entropy_coef", 0.01), ("a2c", "kl_cutoff_coef", 10.0),
    ("a2c", "kl_cutoff_factor", 3.0), ("a2c", "kl_init_penalty", 2.0),
    ("a2c", "normalize_value", True), ("ppo", "optimizer", {"type": "adam"}),
    ("ppo", "value_optimizer", {"type": "adam"}),
    ("tests.algorithms.test_builder:POLICY_ONLY", "value_lr", 0.01),
    ("tests.algorithms.test_builder:POLICY_ONLY", "gae_lambda", 0.9),
])
def test_a_key_the_algorithm_does_not_read_is_an_error(algorithm, key, value):
    """A key that another algorithm reads must keep its default value for one that does
    not (as an unknown key is an error): one line naming the key, the algorithm and the
    default. At its default value the key is accepted."""
    config = configs.load("default", {"algorithm": algorithm, key: value})
    default = configs.dump({key: configs.load("default")[key]}).strip()
    message = (f"config key '{key}' is not read by algorithm '{algorithm}'; remove it or set "
               f"it to its default ({default})")
    with pytest.raises(configs.ConfigError) as error:
        build.algorithm_class(config)
    assert str(error.value) == message
    build.algorithm_class(configs.load("default", {"algorithm": algorithm}))


def test_all_unread_keys_are_named_in_one_line():
    """`--config=pendulum --set algorithm=trpo`: pendulum.yaml's PPO settings are refused,
    all of them in one line, in the order of default.yaml."""
    with pytest.raises(configs.ConfigError) as error:
        build.algorithm_class(configs.load("pendulum", {"algorithm": "trpo"}))
    assert str(error.value) == (
        "config keys 'update_epochs', 'chunk_length', 'batch_size', 'kl_target', "
        "'normalize_value' are not read by algorithm 'trpo'; remove them or set them to their "
        "defaults (update_epochs: 25, chunk_length: null, batch_size: null, kl_target: 0.01, "
        "normalize_value: false)")


def _policy_only_loss(networks, distribution, batch, *, discount, scale=1.0):
    return 0.0 * scale * discount


# No value loss: the value network's keys are not read; its functions read `discount`.
POLICY_ONLY = build_algorithm("policy_only", _policy_only_loss)


def test_build_algorithm_declares_its_functions_keywords():
    assert POLICY_ONLY.config_keys == (
        FunctionalAlgorithm.config_keys - {"value_lr", "value_optimizer"}
        | {"discount", "scale"})
    assert A2C.config_keys == FunctionalAlgorithm.config_keys | {
        "discount", "gae_lambda", "entropy_coef"}
    assert TRPO.config_keys == FunctionalAlgorithm.config_keys | {"discount", "gae_lambda"}


class _RecordingConfig(configs.Config):
    """A config that records the keys read from it (`read`)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


@pytest.mark.parametrize("algorithm", [PPO], ids=["ppo"])
def test_declared_config_keys_are_the_keys_read(algorithm):
    """Building an algorithm and tracing `simulate` with it (the update included) reads
    every key it declares in `config_keys`, and of the keys that any algorithm declares,
    only those. TRPO and A2C: `test_trains_and_empties_its_memory_reading_the_keys_it_declares`."""
    config = _RecordingConfig(configs.load(
        "default", {"policy_layers": [16], "value_layers": [16], "update_every": 3,
                    "lr_schedule": "linear", "kl_schedule": "linear"}))
    config.update(network=feed_forward_gaussian, max_length=8)
    envs = [MockEnvironment((3,), (2,), 2, 4) for _ in range(2)]
    batch_env = InGraphBatchEnv(BatchEnv(envs, blocking=True))
    algo = algorithm(batch_env, tf.Variable(0, dtype=tf.int64), tf.Variable(True),
                     tf.Variable(False), config)
    episode_state(batch_env)
    tf.function(lambda: simulate(batch_env, algo, False, True),
                autograph=False).get_concrete_function()
    declared = set().union(*(other.config_keys for other in build.ALGORITHMS.values()))
    assert set(algorithm.config_keys) <= config.read
    assert config.read & declared == set(algorithm.config_keys)


def test_config_optimizer_replaces_the_algorithm_default():
    algo, _ = _setup(TRPO, [(2, 3)], optimizer={"type": "sgd", "learning_rate": 0.5},
                     value_optimizer={"type": "rmsprop"}, value_lr=0.25)
    policy = algo.checkpoint_state["policy_optimizer"]
    value = algo.checkpoint_state["value_optimizer"]
    assert float(policy.optimizer.learning_rate.numpy()) == 0.5
    assert float(value.optimizer.learning_rate.numpy()) == 0.25
    default, _ = _setup(TRPO, [(2, 3)])
    assert type(default.checkpoint_state["policy_optimizer"]).__name__ == "LineSearch"


def test_parts_gae_and_policy_change_against_numpy():
    """`parts.gae`: the raw GAE(lambda) advantages (eq. 16 of arXiv:1506.02438, one NumPy
    loop per episode) and lambda-returns, 0 at padded steps; `parts.policy_change`: the mean
    closed-form KL of two diagonal Gaussians and the mean entropy over the valid steps."""
    rng = np.random.default_rng(5)
    length = np.array([4, 2], np.int32)
    mask = (np.arange(4)[None] < length[:, None]).astype(np.float32)
    reward, value = rng.normal(size=(2, 2, 4)).astype(np.float32)
    bootstrap = np.array([0.5, -1.0], np.float32)
    batch = {"reward": np.where(mask > 0, reward, 9.0), "value": np.where(mask > 0, value, 4.0),
             "bootstrap": bootstrap, "length": length}
    advantage, returns = parts.gae(batch, discount=0.9, gae_lambda=0.7)
    for e, n in enumerate(length):
        expected, running = np.zeros(n), 0.0
        for t in reversed(range(n)):
            following = bootstrap[e] if t == n - 1 else value[e, t + 1]
            running = reward[e, t] + 0.9 * following - value[e, t] + 0.9 * 0.7 * running
            expected[t] = running
        np.testing.assert_allclose(advantage.numpy()[e, :n], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(returns.numpy()[e, :n], expected + value[e, :n],
                                   rtol=1e-5, atol=1e-6)
    assert not advantage.numpy()[mask == 0].any() and not returns.numpy()[mask == 0].any()

    mean_p, mean_q = rng.normal(size=(2, 2, 4, 3)).astype(np.float32)
    logstd_p, logstd_q = (0.3 * rng.normal(size=(2, 2, 4, 3))).astype(np.float32)
    got = parts.policy_change(DiagonalGaussian({"mean": mean_p, "logstd": logstd_p}),
                              DiagonalGaussian({"mean": mean_q, "logstd": logstd_q}), mask)
    std_p, std_q = np.exp(logstd_p), np.exp(logstd_q)
    kl = np.sum(np.log(std_q / std_p) + (std_p ** 2 + (mean_p - mean_q) ** 2)
                / (2 * std_q ** 2) - 0.5, -1)
    entropy = np.sum(logstd_q + 0.5 * np.log(2 * np.pi * np.e), -1)
    assert float(got["kl"]) == pytest.approx(kl[mask > 0].mean(), rel=1e-5)
    assert float(got["entropy"]) == pytest.approx(entropy[mask > 0].mean(), rel=1e-5)
