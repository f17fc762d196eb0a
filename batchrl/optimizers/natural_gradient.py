"""The natural gradient step of TRPO: conjugate gradient on Fisher-vector products, scaled
to a KL bound.

Schulman, Levine, Moritz, Jordan, Abbeel, "Trust Region Policy Optimization",
arXiv:1502.05477, section 6 and appendix C.
"""

import tensorflow as tf

from batchrl.optimizers import base


def conjugate_gradient(matvec, vector, iterations, residual_tolerance=1e-10):
    """Solves `A x = b` for a symmetric positive-definite `A` given only as `matvec`.

    The conjugate gradient method (Hestenes and Stiefel 1952; Nocedal and Wright,
    "Numerical Optimization", algorithm 5.2), started from x = 0. It stops after
    `iterations` steps or once the squared residual norm |b - A x|^2 falls below
    `residual_tolerance`; in exact arithmetic it solves an n-dimensional system in n steps.

    Args:
      matvec: callable mapping a vector `[n]` to `A v`, `[n]`, of the same dtype.
      vector: `b`, float `[n]`.
      iterations: int >= 1, the most steps.
      residual_tolerance: float >= 0.

    Returns:
      `(x, steps, residual)`: the solution `[n]`, the steps taken (int32 scalar) and the
      squared residual norm of the last step (a scalar of `vector`'s dtype).
    """
    vector = tf.convert_to_tensor(vector)
    tolerance = tf.cast(residual_tolerance, vector.dtype)

    def cond(step, solution, residual, direction, squared):
        del solution, residual, direction
        return tf.logical_and(step < iterations, squared > tolerance)

    def body(step, solution, residual, direction, squared):
        product = matvec(direction)
        # 0 where the direction has no curvature (a singular A): the solution stays.
        alpha = tf.math.divide_no_nan(squared, tf.reduce_sum(direction * product))
        solution = solution + alpha * direction
        residual = residual - alpha * product
        new_squared = tf.reduce_sum(tf.square(residual))
        direction = residual + (new_squared / squared) * direction
        return step + 1, solution, residual, direction, new_squared

    initial = (tf.constant(0), tf.zeros_like(vector), vector, vector,
               tf.reduce_sum(tf.square(vector)))
    step, solution, _, _, squared = tf.while_loop(cond, body, initial)
    return solution, step, squared


def fisher_vector_product(kl_fn, variables, vector, damping=0.0):
    """`(F + damping I) v`, with F the Fisher information matrix of the policy.

    F is the Hessian of the mean KL divergence from the policy as it is (held fixed) to the
    policy of the variables, at the variables' current values (Schulman et al.,
    arXiv:1502.05477, appendix C: "the Hessian of the KL divergence"); the product is the
    gradient of `grad(KL) . v`, so F is never formed.

    Args:
      kl_fn: callable without arguments returning the mean KL, float32 scalar, whose
        reference policy does not depend on `variables`.
      variables: list of float32 `tf.Variable`s.
      vector: float32 `[n]`, n the variables' total size (`base.flatten` order).
      damping: float >= 0, added times `vector` (keeps the system well conditioned).

    Returns:
      float32 `[n]`.
    """
    vector = tf.stop_gradient(vector)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            kl = kl_fn()
        gradient = base.flatten(base.gradients(inner, kl, variables))
        directional = tf.reduce_sum(gradient * vector)
    product = base.flatten(base.gradients(outer, directional, variables))
    return product + damping * vector


class NaturalGradient(base.Optimizer):
    """A step along the natural gradient whose KL divergence is about `max_kl`.

    With g the gradient of the loss and F the Fisher matrix, conjugate gradient solves
    `(F + damping I) s = g` and the step is `-beta s`, `beta = sqrt(2 max_kl / s^T F s)`:
    the quadratic approximation `KL ~ 1/2 beta^2 s^T F s` then equals `max_kl`
    (Schulman et al., arXiv:1502.05477, appendix C; damping as in their code, the scale with
    the undamped F as in the paper's equation).

    Args:
      max_kl: float > 0, the KL divergence the step aims at (delta of the paper), nats.
      cg_iterations: int >= 1, conjugate gradient steps.
      damping: float >= 0.
      cg_residual_tolerance: stop conjugate gradient once |residual|^2 is below it.

    `minimize(loss_fn, variables, kl_fn)` needs `kl_fn` (ValueError without it) and returns
    the diagnostics `loss` (before the step), `gradient_norm`, `cg_iterations`,
    `cg_residual` (squared norm), `expected_improvement` (-g . step, the decrease of the
    loss to first order), `step_norm` and `kl` (measured after the step).
    """

    def __init__(self, max_kl=0.01, cg_iterations=10, damping=0.1,
                 cg_residual_tolerance=1e-10, name="natural_gradient"):
        super().__init__(name=name)
        self.max_kl = float(max_kl)
        self._iterations = int(cg_iterations)
        self._damping = float(damping)
        self._tolerance = float(cg_residual_tolerance)

    def minimize(self, loss_fn, variables, kl_fn=None):
        if kl_fn is None:
            raise ValueError("the natural gradient needs kl_fn, the KL from the policy "
                             "before the update")
        with tf.GradientTape() as tape:
            loss = loss_fn()
        gradient = base.flatten(base.gradients(tape, loss, variables))
        solution, steps, residual = conjugate_gradient(
            lambda v: fisher_vector_product(kl_fn, variables, v, self._damping),
            gradient, self._iterations, self._tolerance)
        curvature = tf.reduce_sum(
            solution * fisher_vector_product(kl_fn, variables, solution))
        beta = tf.where(curvature > 0,
                        tf.sqrt(2 * self.max_kl / tf.maximum(curvature, 1e-20)), 0.0)
        step = -beta * solution
        deltas = base.unflatten(step, variables)
        applied = [variable.assign_add(delta)
                   for variable, delta in zip(variables, deltas, strict=True)]
        with tf.control_dependencies(applied):
            kl = kl_fn()
        return deltas, {
            "loss": loss, "gradient_norm": tf.norm(gradient),
            "cg_iterations": tf.cast(steps, tf.float32), "cg_residual": residual,
            "expected_improvement": -tf.reduce_sum(gradient * step),
            "step_norm": tf.norm(step), "kl": kl}
