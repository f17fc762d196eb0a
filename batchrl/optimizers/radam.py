"""RAdam, rectified Adam (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate
and Beyond", ICLR 2020, arXiv:1908.03265, algorithm 2), as a Keras 3 optimizer.

Adam's adaptive rate 1 / sqrt(v_hat) rests on few gradients in the first steps, and its
variance is then large (or unbounded). RAdam estimates the length rho_t of the simple
moving average that the exponential one in v approximates, and while that is too short
takes the un-adapted step with momentum; afterwards it takes Adam's step scaled by r_t,
which brings the variance of the adaptive rate down to its value as t grows without
bound. With t = iterations + 1, on each variable:

    m = beta_1 m + (1 - beta_1) g;  v = beta_2 v + (1 - beta_2) g^2;  m_hat = m / (1 - beta_1^t)
    rho_inf = 2 / (1 - beta_2) - 1;  rho_t = rho_inf - 2 t beta_2^t / (1 - beta_2^t)
    rho_t > RECTIFY_THRESHOLD:
        r_t = sqrt((rho_t - 4) (rho_t - 2) rho_inf / ((rho_inf - 4) (rho_inf - 2) rho_t))
        variable -= lr r_t m_hat / (sqrt(v / (1 - beta_2^t)) + epsilon)
    otherwise:  variable -= lr m_hat

`RECTIFY_THRESHOLD` is 5, not the paper's 4. Algorithm 2 rectifies once rho_t > 4, where
the variance of the adaptive rate becomes finite; just above 4 that variance is still
huge and the approximation behind r_t is rough. PyTorch's and optax's RAdam test
rho_t > 5 instead, an empirical choice of theirs, not derived in the paper; batchrl
follows them. With it, beta_2 = 0.999 (rho_5 = 4.996) and 0.9 (rho_5 = 4.58) both take
their first rectified step at t = 6, where the threshold 4 would at t = 5.
"""

import keras
from keras import ops

# rho_t above which a step is rectified (the paper's 4; module docstring).
RECTIFY_THRESHOLD = 5.0


class RAdam(keras.optimizers.Optimizer):
    """Rectified Adam (Liu et al. 2020, arXiv:1908.03265, algorithm 2; module docstring).

    Its state, per variable, is Keras' slots `momentum` (m) and `velocity` (v), of the
    variable's shape and dtype, and Keras' int64 `iterations`; a `tf.train.Checkpoint`
    holding the optimizer holds them. The step is branch-free (`ops.where`), so that it
    traces into `tf.function` and compiles with XLA (on CPU and GPU; TPUs lack the float64
    below). Its scalars (bias corrections, rho_t, r_t) are computed in float64: rho_t is
    the difference of two numbers near 2 / (1 - beta_2) (about 2,000), which in float32
    was off by up to 0.7 % for beta_2 = 0.999 in the first 12 steps; m, v and the
    variable keep their own dtype.

    Args:
      learning_rate: a float, a Keras learning rate schedule or a callable; lr.
      beta_1: float in [0, 1), the decay of the first moment m.
      beta_2: float in [0, 1), the decay of the second moment v.
      epsilon: float > 0, added to sqrt(v / (1 - beta_2^t)) (as in the paper's rule).
      **kwargs: Keras' optimizer keyword arguments (`name`, `weight_decay`,
        `clipnorm`, ...).
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list):
        """Creates m and v (zeros of each variable's shape and dtype) for `var_list`."""
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"])

    def _scalars(self, learning_rate):
        """This step's float64 scalars: whether it is rectified, the factor of m in the
        rectified step (lr r_t / (1 - beta_1^t)) and in the other (lr / (1 - beta_1^t)),
        and 1 / sqrt(1 - beta_2^t)."""
        t = ops.cast(self.iterations + 1, "float64")
        beta_1 = ops.convert_to_tensor(self.beta_1, "float64")
        beta_2 = ops.convert_to_tensor(self.beta_2, "float64")
        lr = ops.cast(learning_rate, "float64")
        beta_1_power, beta_2_power = ops.power(beta_1, t), ops.power(beta_2, t)
        rho_inf = 2.0 / (1.0 - beta_2) - 1.0
        rho = rho_inf - 2.0 * t * beta_2_power / (1.0 - beta_2_power)
        ratio = ((rho - 4.0) * (rho - 2.0) * rho_inf
                 / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho))
        # Below the threshold the ratio may be negative (or rho_inf - 4 zero); unused then.
        r = ops.sqrt(ops.maximum(ratio, 0.0))
        plain = lr / (1.0 - beta_1_power)
        return rho > RECTIFY_THRESHOLD, plain * r, plain, 1.0 / ops.sqrt(1.0 - beta_2_power)

    def update_step(self, gradient, variable, learning_rate):
        """One RAdam step of `variable` (a float variable the optimizer was built for) on
        `gradient` (a tensor of its shape, cast to its dtype), with `learning_rate` a
        float scalar tensor; `iterations` is counted by Keras' `apply_gradients`."""
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(
            v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        rectified, adaptive, plain, v_scale = self._scalars(learning_rate)
        denominator = ops.add(ops.multiply(ops.sqrt(v), ops.cast(v_scale, dtype)),
                              ops.cast(self.epsilon, dtype))
        step = ops.where(rectified,
                         ops.divide(ops.multiply(m, ops.cast(adaptive, dtype)), denominator),
                         ops.multiply(m, ops.cast(plain, dtype)))
        self.assign_sub(variable, step)

    def get_config(self):
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config
