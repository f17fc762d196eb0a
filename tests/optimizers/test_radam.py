"""RAdam (`batchrl.optimizers.radam`) against a NumPy reference of Liu et al. 2020
(arXiv:1908.03265, algorithm 2, rectified once rho_t > 5): eagerly, in a `tf.function` and
under XLA, through `optimizers.create({"type": "radam"})`, and across a checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

from batchrl import optimizers
from batchrl.optimizers import fused_adam, radam
from batchrl.optimizers import spec as spec_lib
from tests.optimizers import numpy_steps

# Global norms of the 12 steps' gradients: large and small, so that the adaptive rate
# matters; random directions change the signs.
_NORMS = (1.0, 0.05, 2.0, 0.3, 0.8, 0.01, 1.5, 0.2, 0.6, 3.0, 0.1, 0.9)


def _rho(t, beta_2):
    """The length of the approximated simple moving average at step t (algorithm 2)."""
    rho_inf = 2 / (1 - beta_2) - 1
    return rho_inf - 2 * t * beta_2 ** t / (1 - beta_2 ** t)


def radam_steps(start, gradients, rate, beta_1, beta_2, epsilon, max_norm=None,
                threshold=5.0):
    """RAdam in float64 from `start` (list of arrays) on each step's gradients (clipped to
    the global norm `max_norm` first); returns the values after each step, whether each
    step was rectified, and each step's norm before clipping."""
    values = [np.asarray(value, np.float64) for value in start]
    m = [np.zeros_like(value) for value in values]
    v = [np.zeros_like(value) for value in values]
    rho_inf = 2 / (1 - beta_2) - 1
    trajectory, rectified, norms = [], [], []
    for t, step in enumerate(gradients, 1):
        step, norm = numpy_steps.clipped(step, max_norm)
        norms.append(norm)
        rho = _rho(t, beta_2)
        rectified.append(rho > threshold)
        for i, g in enumerate(step):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            m_hat = m[i] / (1 - beta_1 ** t)
            if rho > threshold:
                r = np.sqrt((rho - 4) * (rho - 2) * rho_inf
                            / ((rho_inf - 4) * (rho_inf - 2) * rho))
                v_hat = v[i] / (1 - beta_2 ** t)
                values[i] = values[i] - rate * r * m_hat / (np.sqrt(v_hat) + epsilon)
            else:
                values[i] = values[i] - rate * m_hat
        trajectory.append([value.copy() for value in values])
    return trajectory, rectified, norms


def _problem(seed, shapes):
    """Float32 start values of `shapes`, 2 to 3 away from zero (so that a relative
    tolerance fits every entry), and 12 steps of float32 gradients of norms `_NORMS`."""
    random = np.random.default_rng(seed)
    start = [(random.choice([-1, 1], size=shape) * random.uniform(2, 3, size=shape))
             .astype(np.float32) for shape in shapes]
    return start, numpy_steps.random_gradients(random, shapes, _NORMS)


@pytest.mark.parametrize("beta_2", [0.999, 0.9])
def test_the_first_rectified_step_is_the_sixth(beta_2):
    """Steps 1-5 are un-rectified and 6-12 rectified (with the paper's 4, step 5 would be
    rectified too), so the tests below cover both kinds."""
    rhos = [_rho(t, beta_2) for t in range(1, 13)]
    assert [rho > radam.RECTIFY_THRESHOLD for rho in rhos] == [False] * 5 + [True] * 7
    assert radam.RECTIFY_THRESHOLD == 5.0 and 4 < rhos[4] < 5


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("shapes, beta_1, beta_2, epsilon", [
    ([(5,)], 0.9, 0.999, 1e-8),
    ([(3, 2), (2,)], 0.8, 0.9, 1e-7),
    ([(4,)], 0.0, 0.99, 1e-3),
])
def test_radam_steps_as_the_reference(shapes, beta_1, beta_2, epsilon, mode):
    """12 steps of `RAdam.apply_gradients` on float32 variables equal the float64 NumPy
    rule after every step to 1e-6 relative (eagerly, traced, and compiled with XLA)."""
    start, gradients = _problem(len(shapes), shapes)
    expected, rectified, _ = radam_steps(start, gradients, 0.05, beta_1, beta_2, epsilon)
    assert rectified == [False] * 5 + [True] * 7
    variables = [tf.Variable(value) for value in start]
    optimizer = radam.RAdam(0.05, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
    optimizer.build(variables)

    def step(gradient):
        return optimizer.apply_gradients(zip(gradient, variables, strict=True))

    if mode != "eager":
        step = tf.function(step, autograph=False, jit_compile=mode == "xla")
    for t, (gradient, values) in enumerate(zip(gradients, expected, strict=True), 1):
        step([tf.constant(g) for g in gradient])
        for variable, value in zip(variables, values, strict=True):
            np.testing.assert_allclose(variable.numpy(), value, rtol=1e-6, err_msg=f"t={t}")
    assert int(optimizer.iterations) == 12
    assert all(variable.dtype == tf.float32 for variable in optimizer.variables[1:])


def test_a_declared_radam_applies_clipped_gradients_in_a_function():
    """`{type: radam}` gets adam's keys and defaults; `create` builds a `KerasOptimizer`
    around `RAdam` (not the fused Adam kernels) whose `apply`, traced, clips to the
    global norm and steps as the reference."""
    assert spec_lib.check({"type": "radam"}) == {
        "type": "radam", "learning_rate": None, "beta_1": 0.9, "beta_2": 0.999,
        "epsilon": 1e-7, "max_gradient_norm": None}
    with pytest.raises(ValueError, match="'optimizer' has unknown key 'amsgrad'"):
        spec_lib.check({"type": "radam", "amsgrad": True})
    start, gradients = _problem(7, [(3, 2), (2,)])
    expected, _, norms = radam_steps(start, gradients, 0.1, 0.9, 0.9, 1e-8, max_norm=0.5)
    variables = [tf.Variable(value) for value in start]
    optimizer = optimizers.create(
        {"type": "radam", "beta_2": 0.9, "epsilon": 1e-8}, learning_rate=0.1,
        max_gradient_norm=0.5)
    assert isinstance(optimizer, optimizers.KerasOptimizer) and optimizer.steps_on_gradients
    assert isinstance(optimizer.optimizer, optimizers.RAdam)
    optimizer.build(variables)
    assert not fused_adam.can_fuse(optimizer.optimizer, variables)
    step = tf.function(lambda g: optimizer.apply(g, variables), autograph=False)
    for gradient, norm in zip(gradients, norms, strict=True):
        diagnostics = step([tf.constant(g) for g in gradient])
        assert float(diagnostics["gradient_norm"]) == pytest.approx(norm, rel=1e-6)
    for variable, value in zip(variables, expected[-1], strict=True):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-6)
    config = optimizer.optimizer.get_config()
    assert (config["beta_1"], config["beta_2"], config["epsilon"]) == (0.9, 0.9, 1e-8)


def test_a_checkpoint_restores_the_moments_and_the_step_count(tmp_path):
    """Saved after 4 steps and restored into a fresh optimizer, RAdam's next 8 steps
    (un-rectified, then rectified from step 6) equal those of the optimizer that never
    stopped."""
    start, gradients = _problem(11, [(3, 2), (2,)])
    gradients = [[tf.constant(g) for g in gradient] for gradient in gradients]
    spec = {"type": "radam", "learning_rate": 0.05, "beta_2": 0.9}

    def make(values):
        variables = [tf.Variable(value) for value in values]
        optimizer = optimizers.create(spec)
        optimizer.build(variables)
        return variables, optimizer, tf.function(
            lambda g: optimizer.apply(g, variables), autograph=False)

    variables, optimizer, step = make(start)
    for gradient in gradients[:4]:
        step(gradient)
    path = tf.train.Checkpoint(optimizer=optimizer, variables=variables).write(
        str(tmp_path / "radam"))
    restored, other, other_step = make([np.zeros_like(value) for value in start])
    tf.train.Checkpoint(optimizer=other, variables=restored).read(path).assert_consumed()
    assert int(other.optimizer.iterations) == 4
    for ours, theirs in zip(other.optimizer.variables, optimizer.optimizer.variables,
                            strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    for gradient in gradients[4:]:
        step(gradient)
        other_step(gradient)
    for ours, theirs in zip(restored, variables, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    expected, _, _ = radam_steps(start, [[g.numpy() for g in gradient] for gradient in gradients],
                                 0.05, 0.9, 0.9, 1e-7)
    for variable, value in zip(restored, expected[-1], strict=True):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-6)
