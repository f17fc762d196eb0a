"""The optimizer modules against NumPy: conjugate gradient, Fisher-vector products, the
natural gradient's KL, the line search's guarantees, multi-step, clipped step, Keras."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from batchrl import optimizers
from batchrl.networks.distributions import Categorical, DiagonalGaussian
from batchrl.optimizers import base, fused_adam
from batchrl.optimizers import spec as spec_lib
from tests.optimizers import numpy_steps


@pytest.mark.parametrize("size, seed", [(2, 0), (7, 1), (20, 2), (50, 3)])
def test_conjugate_gradient_solves_random_spd_systems(size, seed):
    random = np.random.default_rng(seed)
    basis = random.normal(size=(size, size))
    matrix = basis @ basis.T + 0.5 * np.eye(size)  # Condition numbers up to a few 1,000s.
    vector = random.normal(size=size)
    solution, steps, residual = optimizers.conjugate_gradient(
        lambda v: tf.linalg.matvec(tf.constant(matrix), v), tf.constant(vector),
        iterations=3 * size, residual_tolerance=1e-20)
    expected = np.linalg.solve(matrix, vector)
    np.testing.assert_allclose(solution.numpy(), expected, rtol=1e-6, atol=1e-8)
    assert int(steps) <= 3 * size
    assert float(residual) <= 1e-18


def test_conjugate_gradient_stops_at_its_iterations_and_reports_the_residual():
    random = np.random.default_rng(4)
    basis = random.normal(size=(30, 30))
    matrix = basis @ basis.T + np.eye(30)
    vector = random.normal(size=30)
    solution, steps, residual = optimizers.conjugate_gradient(
        lambda v: tf.linalg.matvec(tf.constant(matrix), v), tf.constant(vector), 5)
    assert int(steps) == 5
    actual = np.sum(np.square(vector - matrix @ solution.numpy()))
    np.testing.assert_allclose(float(residual), actual, rtol=1e-6)
    assert actual < np.sum(np.square(vector)), "five steps reduce the residual"


def _linear_policy(seed, observ_size=3, action_size=2, gaussian=True):
    """Variables of a linear policy (`W`, `b` and for a Gaussian a state-independent
    `logstd`), observations `[64, observ_size]`, and a function of the parameters."""
    random = np.random.default_rng(seed)
    weights = tf.Variable(random.normal(size=(observ_size, action_size)) * 0.5, dtype=tf.float32)
    bias = tf.Variable(random.normal(size=action_size) * 0.1, dtype=tf.float32)
    variables = [weights, bias]
    observ = tf.constant(random.normal(size=(64, observ_size)), tf.float32)
    if gaussian:
        logstd = tf.Variable(random.normal(size=action_size) * 0.3 - 0.5, dtype=tf.float32)
        variables.append(logstd)

        def params():
            mean = observ @ weights + bias
            return {"mean": mean, "logstd": tf.broadcast_to(logstd, tf.shape(mean))}
    else:
        def params():
            return {"logits": observ @ weights + bias}
    return variables, observ.numpy(), params


def _kl_from_now(distribution, params):
    """`kl_fn`: the mean KL from the policy as it is now (held fixed) to the current one."""
    reference = {key: tf.constant(value) for key, value in params().items()}
    return lambda: tf.reduce_mean(distribution(reference).kl(distribution(params())))


def _explicit_fisher(observ, variables, gaussian):
    """F = mean over observations of J^T F_out J, with F_out the Fisher information of the
    distribution in its own parameters: diag(1 / sigma^2) for the mean and 2 for each log
    standard deviation of a Gaussian; diag(p) - p p^T for the logits of a categorical."""
    weights, bias = variables[0].numpy(), variables[1].numpy()
    inputs, outputs = weights.shape
    total = sum(int(np.prod(v.shape)) for v in variables)
    fisher = np.zeros((total, total))
    for row in observ:
        out = row @ weights + bias
        jacobian = np.zeros((outputs, total))
        for j in range(outputs):
            jacobian[j, [i * outputs + j for i in range(inputs)]] = row
            jacobian[j, inputs * outputs + j] = 1.0
        if gaussian:
            logstd = variables[2].numpy()
            std_jacobian = np.zeros((outputs, total))
            std_jacobian[np.arange(outputs), inputs * outputs + outputs + np.arange(outputs)] = 1
            jacobian = np.concatenate([jacobian, std_jacobian])
            inner = np.diag(np.concatenate([np.exp(-2 * logstd), np.full(outputs, 2.0)]))
        else:
            p = np.exp(out - out.max())
            p /= p.sum()
            inner = np.diag(p) - np.outer(p, p)
        fisher += jacobian.T @ inner @ jacobian
    return fisher / len(observ)


@pytest.mark.parametrize("gaussian", [True, False], ids=["gaussian", "categorical"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fisher_vector_product_equals_the_explicit_fisher_matrix_times_a_vector(
        gaussian, seed):
    variables, observ, params = _linear_policy(seed, gaussian=gaussian)
    distribution = DiagonalGaussian if gaussian else Categorical
    kl_fn = _kl_from_now(distribution, params)
    fisher = _explicit_fisher(observ, variables, gaussian)
    vector = np.random.default_rng(seed + 10).normal(size=len(fisher)).astype(np.float32)
    product = optimizers.fisher_vector_product(kl_fn, variables, tf.constant(vector))
    np.testing.assert_allclose(product.numpy(), fisher @ vector, rtol=1e-4, atol=1e-5)
    damped = optimizers.fisher_vector_product(kl_fn, variables, tf.constant(vector), 0.1)
    np.testing.assert_allclose(damped.numpy(), fisher @ vector + 0.1 * vector,
                               rtol=1e-4, atol=1e-5)


def _mlp_policy(seed, gaussian):
    """A tanh MLP policy on 128 random observations, its surrogate loss on random
    advantages of actions sampled from it, and its variables."""
    random = np.random.default_rng(seed)
    observ = tf.constant(random.normal(size=(128, 4)), tf.float32)
    hidden = keras.layers.Dense(16, activation="tanh")
    head = keras.layers.Dense(3)
    logstd = tf.Variable(np.full(3, -0.3), dtype=tf.float32)

    def params():
        out = head(hidden(observ))
        if gaussian:
            return {"mean": out, "logstd": tf.broadcast_to(logstd, tf.shape(out))}
        return {"logits": out}

    first = params()
    variables = hidden.trainable_variables + head.trainable_variables
    variables += [logstd] if gaussian else []
    distribution = DiagonalGaussian if gaussian else Categorical
    old = distribution({key: tf.constant(value) for key, value in first.items()})
    action = old.sample(tf.random.Generator.from_seed(seed))
    advantage = tf.constant(random.normal(size=128), tf.float32)

    def loss_fn():
        ratio = tf.exp(distribution(params()).log_prob(action) - old.log_prob(action))
        return -tf.reduce_mean(ratio * advantage)

    return variables, loss_fn, _kl_from_now(distribution, params)


@pytest.mark.parametrize("gaussian", [True, False], ids=["gaussian", "categorical"])
@pytest.mark.parametrize("max_kl", [0.001, 0.01, 0.05])
def test_natural_gradient_step_has_about_max_kl(gaussian, max_kl):
    """Before any line search, the step's measured KL is within [0.5, 1.5] x max_kl."""
    for seed in range(3):
        variables, loss_fn, kl_fn = _mlp_policy(seed, gaussian)
        start = [v.numpy().copy() for v in variables]
        optimizer = optimizers.NaturalGradient(max_kl, cg_iterations=10, damping=0.1)
        deltas, diagnostics = _run(lambda: optimizer.minimize(loss_fn, variables, kl_fn),  # noqa: B023
                                   traced=max_kl == 0.01 and seed == 0)
        kl = float(kl_fn())
        assert 0.5 * max_kl <= kl <= 1.5 * max_kl, (seed, kl)
        np.testing.assert_allclose(float(diagnostics["kl"]), kl, rtol=1e-4)
        for variable, before, delta in zip(variables, start, deltas, strict=True):
            np.testing.assert_allclose(variable.numpy(), before + delta.numpy(), atol=1e-6)
        assert float(diagnostics["expected_improvement"]) > 0
        assert 1 <= float(diagnostics["cg_iterations"]) <= 10


def test_natural_gradient_needs_a_kl_function():
    variables, loss_fn, _ = _mlp_policy(0, True)
    with pytest.raises(ValueError, match="kl_fn"):
        optimizers.NaturalGradient().minimize(loss_fn, variables)


def _run(function, traced):
    """Calls `function` eagerly, or `traced` in a `tf.function` (tests run mostly eagerly:
    tracing takes longer than the computation here)."""
    return tf.function(function, autograph=False)() if traced else function()


class _Proposes(base.Optimizer):
    """A test optimizer whose step is `scale` times the gradient (an ascent for scale > 0)."""

    def __init__(self, scale):
        super().__init__()
        self._scale = scale

    def minimize(self, loss_fn, variables, kl_fn=None):
        with tf.GradientTape() as tape:
            loss = loss_fn()
        deltas = [self._scale * g for g in base.gradients(tape, loss, variables)]
        for variable, delta in zip(variables, deltas, strict=True):
            variable.assign_add(delta)
        return deltas, {"loss": loss}


def _search(inner, max_kl, seed, gaussian=True, traced=False, **options):
    """Runs a line search around `inner` on an MLP policy (eagerly, or `traced`); returns
    the loss and KL before and after, the start values, the variables, and the
    diagnostics."""
    variables, loss_fn, kl_fn = _mlp_policy(seed, gaussian)
    start = [v.numpy().copy() for v in variables]
    before = float(loss_fn())
    search = optimizers.LineSearch(inner, max_kl=max_kl, **options)
    deltas, diagnostics = _run(lambda: search.minimize(loss_fn, variables, kl_fn), traced)
    return before, float(loss_fn()), float(kl_fn()), start, variables, deltas, diagnostics


@pytest.mark.parametrize("scale", [-0.3, -3.0, -30.0, -300.0, 0.5])
@pytest.mark.parametrize("max_kl", [0.002, 0.02, None])
def test_line_search_never_accepts_a_worse_loss_or_a_broken_constraint(scale, max_kl):
    """Gradient steps from small to far too large, and an ascent (scale > 0): an accepted
    fraction lowers the loss and keeps the KL within the bound; otherwise every variable
    is back at its start, exactly."""
    accepted_any = False
    for seed in range(3):
        before, after, kl, start, variables, deltas, diagnostics = _search(
            _Proposes(scale), max_kl, seed, traced=seed == 0 and scale == -3.0,
            max_iterations=8)
        if float(diagnostics["line_search/accepted"]):
            accepted_any = True
            assert after < before
            assert max_kl is None or kl <= max_kl
            fraction = float(diagnostics["line_search/fraction"])
            assert 0 < fraction <= 1
            np.testing.assert_allclose(float(diagnostics["line_search/improvement"]),
                                       before - after, rtol=1e-4, atol=1e-7)
        else:
            for variable, value in zip(variables, start, strict=True):
                np.testing.assert_array_equal(variable.numpy(), value)
            assert float(diagnostics["line_search/fraction"]) == 0.0
            assert all(not np.any(delta.numpy()) for delta in deltas)
    if scale > 0:
        assert not accepted_any, "an ascent is never accepted"
    if scale == -0.3 and max_kl != 0.002:
        assert accepted_any, "a small descent step is accepted"


def test_line_search_backtracks_an_overlong_step_to_one_it_accepts():
    before, after, kl, _, _, _, diagnostics = _search(
        _Proposes(-300.0), 0.02, 0, max_iterations=20)
    assert float(diagnostics["line_search/accepted"]) == 1.0
    assert float(diagnostics["line_search/backtracks"]) >= 1
    fraction = float(diagnostics["line_search/fraction"])
    assert fraction == pytest.approx(0.5 ** float(diagnostics["line_search/backtracks"]))
    assert after < before and kl <= 0.02


def test_line_search_restores_the_variables_when_the_constraint_always_fails():
    """A tiny KL bound and two fractions: the descent improves the loss but is refused."""
    before, after, kl, start, variables, _, diagnostics = _search(
        _Proposes(-30.0), 1e-9, 1, max_iterations=2)
    assert float(diagnostics["line_search/accepted"]) == 0.0
    assert float(diagnostics["line_search/backtracks"]) == 2.0
    assert after == before and kl == 0.0
    for variable, value in zip(variables, start, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_trpo_step_natural_gradient_with_line_search_keeps_the_kl_bound():
    for seed in range(3):
        inner = optimizers.NaturalGradient(0.01)
        before, after, kl, *_ = _search(inner, 0.01, seed, gaussian=seed % 2 == 0,
                                        traced=seed == 0)
        assert kl <= 0.01 and after <= before


def test_multi_step_takes_n_steps_of_its_inner_optimizer():
    """Three SGD steps on 0.5 |x - t|^2 move x to t + (1 - lr)^3 (x - t)."""
    x = tf.Variable([1.0, -2.0])
    target = tf.constant([0.5, 0.5])
    optimizer = optimizers.create({"type": "multi_step", "steps": 3,
                                   "optimizer": {"type": "sgd", "learning_rate": 0.2}})
    optimizer.build([x])
    deltas, diagnostics = tf.function(lambda: optimizer.minimize(
        lambda: 0.5 * tf.reduce_sum(tf.square(x - target)), [x]), autograph=False)()
    expected = np.array([0.5, 0.5]) + 0.8 ** 3 * np.array([0.5, -2.5])
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(deltas[0].numpy(), expected - [1.0, -2.0], rtol=1e-5)
    assert float(diagnostics["loss"]) == pytest.approx(0.5 * (0.25 + 6.25))


def test_clipped_step_limits_the_norm_and_keeps_the_direction():
    x = tf.Variable([3.0, 4.0])
    optimizer = optimizers.create({"type": "sgd", "learning_rate": 1.0,
                                   "clipped_step": {"max_norm": 0.5}})
    optimizer.build([x])
    deltas, diagnostics = optimizer.minimize(lambda: 0.5 * tf.reduce_sum(tf.square(x)), [x])
    np.testing.assert_allclose(x.numpy(), [3.0 - 0.3, 4.0 - 0.4], rtol=1e-6)
    np.testing.assert_allclose(deltas[0].numpy(), [-0.3, -0.4], rtol=1e-6)
    assert float(diagnostics["clipped_step/norm"]) == pytest.approx(5.0)


@pytest.mark.parametrize("max_norm, scale", [(None, 1.0), (0.5, 0.1), (10.0, 1.0)])
def test_keras_apply_scales_long_gradients_to_max_norm(max_norm, scale):
    """SGD at rate 1 moves by the gradient times min(1, max_norm / |g|); the returned norm
    is |g| = 5 before clipping."""
    x, y = tf.Variable([1.0, 1.0]), tf.Variable([[1.0]])
    optimizer = optimizers.create({"type": "sgd", "learning_rate": 1.0},
                                  max_gradient_norm=max_norm)
    optimizer.build([x, y])
    diagnostics = optimizer.apply([tf.constant([3.0, 0.0]), tf.constant([[4.0]])], [x, y])
    assert list(diagnostics) == ["gradient_norm"]
    assert float(diagnostics["gradient_norm"]) == pytest.approx(5.0)
    np.testing.assert_allclose(x.numpy(), [1.0 - 3.0 * scale, 1.0], rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), [[1.0 - 4.0 * scale]], rtol=1e-6)


@pytest.mark.parametrize("max_norm", [None, 0.3])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_keras_apply_is_the_rule_on_globally_clipped_gradients(kind, max_norm):
    """`apply` in a `tf.function`, as the algorithms call it, on four steps of gradients
    of global norms 2, 0.05, 0.9 and 0.2 (so that 0.3 clips some steps and not others)
    against NumPy: global norm clipping, then Adam's step (the fused kernels) or SGD
    with momentum's (Keras' `apply_gradients`); `gradient_norm` is each step's norm
    before clipping."""
    random = np.random.default_rng(5)
    start = [random.normal(size=(3, 2)).astype(np.float32),
             random.normal(size=(2,)).astype(np.float32)]
    gradients = numpy_steps.random_gradients(random, [(3, 2), (2,)], (2.0, 0.05, 0.9, 0.2))
    variables = [tf.Variable(value) for value in start]
    if kind == "adam":
        spec = {"type": "adam", "learning_rate": 0.1}
        expected, norms = numpy_steps.adam_steps(start, gradients, max_norm, 0.1)
    else:
        spec = {"type": "sgd", "learning_rate": 0.1, "momentum": 0.5}
        expected, norms = numpy_steps.momentum_steps(start, gradients, max_norm, 0.1, 0.5)
    optimizer = optimizers.create(spec, max_gradient_norm=max_norm)
    optimizer.build(variables)
    assert fused_adam.can_fuse(optimizer.optimizer, variables) == (kind == "adam")
    step = tf.function(lambda g: optimizer.apply(g, variables), autograph=False)
    for gradient, norm in zip(gradients, norms, strict=True):
        diagnostics = step([tf.constant(g) for g in gradient])
        assert float(diagnostics["gradient_norm"]) == pytest.approx(norm, rel=1e-6)
    for variable, value in zip(variables, expected, strict=True):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", [
    {"type": "natural_gradient"},
    {"type": "adam", "learning_rate": 0.1, "clipped_step": {"max_norm": 1.0}},
    {"type": "multi_step", "steps": 2, "optimizer": {"type": "sgd", "learning_rate": 0.1}},
])
def test_rules_that_need_the_loss_do_not_apply_given_gradients(spec):
    x = tf.Variable([1.0])
    optimizer = optimizers.create(spec)
    optimizer.build([x])
    with pytest.raises(NotImplementedError, match="use minimize"):
        optimizer.apply([tf.constant([1.0])], [x])
    assert x.numpy().tolist() == [1.0]


@pytest.mark.parametrize("kind, keras_class, options", [
    ("adam", keras.optimizers.Adam, {"beta_1": 0.8}),
    ("sgd", keras.optimizers.SGD, {"momentum": 0.5}),
    ("rmsprop", keras.optimizers.RMSprop, {"rho": 0.8}),
])
def test_keras_optimizers_step_as_keras_does(kind, keras_class, options):
    """Adam runs as TensorFlow's fused kernel (`fused_adam`), which evaluates Keras'
    expressions in another order: equal to float32 rounding, hence rtol 1e-5."""
    start = np.array([1.0, -2.0, 0.5], np.float32)
    ours, theirs = tf.Variable(start), tf.Variable(start)

    def loss(x):
        return tf.reduce_sum(tf.square(x) * [1.0, 2.0, 3.0])

    optimizer = optimizers.create(dict(type=kind, **options), learning_rate=0.1)
    optimizer.build([ours])
    reference = keras_class(0.1, **options)
    for _ in range(3):
        deltas, diagnostics = optimizer.minimize(lambda: loss(ours), [ours])
        with tf.GradientTape() as tape:
            value = loss(theirs)
        reference.apply_gradients([(tape.gradient(value, theirs), theirs)])
        assert float(diagnostics["loss"]) == pytest.approx(float(value), rel=1e-5)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5)
    optimizer.scale_learning_rate(0.5)
    assert float(optimizer.optimizer.learning_rate.numpy()) == pytest.approx(0.05)


def test_only_a_plain_adam_runs_fused_and_a_missing_gradient_changes_nothing():
    """`KerasOptimizer.apply` takes the fused kernels for batchrl's Adam only (Keras'
    options that change the rule fall back to `apply_gradients`); a None gradient leaves
    its variable and moments alone, as Keras does, while `iterations` counts the step."""
    x, y = tf.Variable([1.0, -2.0]), tf.Variable([3.0])
    optimizer = optimizers.create({"type": "adam"}, learning_rate=0.1)
    plain = optimizer.optimizer
    assert not plain.built and not fused_adam.can_fuse(plain, [x, y])
    optimizer.build([x, y])
    assert fused_adam.can_fuse(plain, [x, y])
    for options in ({"amsgrad": True}, {"weight_decay": 0.1}, {"clipnorm": 1.0}):
        other = keras.optimizers.Adam(0.1, **options)
        other.build([x, y])
        assert not fused_adam.can_fuse(other, [x, y]), options
    assert not fused_adam.can_fuse(keras.optimizers.AdamW(0.1), [x, y])
    optimizer.apply([tf.constant([1.0, 1.0]), None], [x, y])
    np.testing.assert_allclose(x.numpy(), [0.9, -2.1], rtol=1e-5)  # First step: lr sign(g).
    assert y.numpy().tolist() == [3.0] and int(plain.iterations) == 1
    # Keras' slots: m and v of x, then of y; m = (1 - beta_1) g, v = (1 - beta_2) g^2
    # (1 - 0.999 is 0.99999 of 1e-3 in float32).
    assert [float(tf.reduce_sum(slot)) for slot in plain.variables[-4:]] == [
        pytest.approx(0.2, rel=1e-5), pytest.approx(2e-3, rel=1e-4), 0.0, 0.0]


def test_a_declared_trpo_optimizer_is_a_line_search_around_the_natural_gradient():
    optimizer = optimizers.create({"type": "natural_gradient", "max_kl": 0.02,
                                   "line_search": {"max_iterations": 5}})
    assert isinstance(optimizer, optimizers.LineSearch)
    assert isinstance(optimizer.optimizer, optimizers.NaturalGradient)
    assert optimizer._max_kl == 0.02 and optimizer.optimizer.max_kl == 0.02


@pytest.mark.parametrize("spec, message", [
    ({"type": "adamw"}, "'optimizer' has unknown type 'adamw' .did you mean adam"),
    ({"max_kl": 0.01}, "'optimizer' has no 'type'"),
    ({"type": "natural_gradient", "line_search": {"max_iter": 3}},
     "'optimizer.line_search' has unknown key 'max_iter' .did you mean max_iterations"),
    ({"type": "natural_gradient", "max_kl": -1}, "'optimizer.max_kl' must be positive"),
    ({"type": "natural_gradient", "cg_iterations": 2.5},
     "'optimizer.cg_iterations' must be a positive integer"),
    ({"type": "multi_step", "optimizer": {"type": "adam"}}, "needs the key 'steps'"),
    ({"type": "multi_step", "steps": 2, "optimizer": {"type": "adm"}},
     "'optimizer.optimizer' has unknown type 'adm'"),
    ({"type": "adam", "beta_1": 1.5}, "'optimizer.beta_1' must be in"),
    ("adam", "'optimizer' must be a mapping"),
])
def test_bad_declarations_name_the_culprit(spec, message):
    with pytest.raises(ValueError, match=message):
        spec_lib.check(spec)


def test_declarations_get_their_defaults():
    checked = spec_lib.check({"type": "natural_gradient", "line_search": {}})
    assert checked == {
        "type": "natural_gradient", "max_kl": 0.01, "cg_iterations": 10, "damping": 0.1,
        "cg_residual_tolerance": 1e-10,
        "line_search": {"max_iterations": 10, "accept_ratio": 0.1, "backtrack_ratio": 0.5,
                        "max_kl": None}}
    assert spec_lib.check(checked) == checked
