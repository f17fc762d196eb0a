"""Backtracking line search along the step another optimizer proposes."""

import tensorflow as tf

from batchrl.optimizers import base


class LineSearch(base.Wrapper):
    """Takes the largest fraction of an inner optimizer's step that improves the loss
    enough and keeps the KL within a bound; restores the variables when none does.

    The inner optimizer proposes a step (delta). With the loss L_0 and its gradient g
    before it, the fractions 1, r, r^2, ... (r = `backtrack_ratio`) are tried, at most
    `max_iterations`; a fraction f is accepted when the loss L_f after `f delta`
    improves, L_0 - L_f > 0, by at least `accept_ratio` times the first-order prediction
    -f g . delta, and, with `max_kl`, the KL divergence from the policy before the update
    is at most `max_kl` (Schulman et al., arXiv:1502.05477, appendix C: "we perform the
    line search on the objective ... while also checking the KL constraint"). When no
    fraction is accepted the variables get back their values from before the step.

    Args:
      optimizer: the inner `base.Optimizer` that proposes the step.
      max_iterations: int >= 1, fractions tried.
      accept_ratio: float >= 0.
      backtrack_ratio: float in (0, 1).
      max_kl: float > 0 or None (no constraint); needs `kl_fn` in `minimize`.

    `minimize` returns the inner optimizer's diagnostics and `line_search/fraction` (the
    accepted fraction, 0 when none), `line_search/accepted` (1 or 0),
    `line_search/backtracks` (fractions rejected), `line_search/improvement` (L_0 minus
    the loss after the update) and, with `max_kl`, `line_search/kl` (after the update).
    """

    def __init__(self, optimizer, max_iterations=10, accept_ratio=0.1, backtrack_ratio=0.5,
                 max_kl=None, name="line_search"):
        super().__init__(optimizer, name=name)
        self._iterations = int(max_iterations)
        self._accept_ratio = float(accept_ratio)
        self._backtrack_ratio = float(backtrack_ratio)
        self._max_kl = None if max_kl is None else float(max_kl)

    def minimize(self, loss_fn, variables, kl_fn=None):
        if self._max_kl is not None and kl_fn is None:
            raise ValueError("a line search with max_kl needs kl_fn")
        start = base.read(variables)
        with tf.control_dependencies(start), tf.GradientTape() as tape:
            initial = loss_fn()
        gradient = base.gradients(tape, initial, variables)
        with tf.control_dependencies(gradient):
            deltas, diagnostics = self.optimizer.minimize(loss_fn, variables, kl_fn)
        expected = -base.dot(gradient, deltas)  # The first-order decrease of the full step.

        def evaluate(fraction):
            """The loss, KL and acceptance after moving the variables to `fraction`."""
            moved = base.assign(variables, [s + fraction * d for s, d in zip(
                start, deltas, strict=True)])
            with tf.control_dependencies([moved]):
                loss = loss_fn()
                kl = kl_fn() if self._max_kl is not None else tf.constant(0.0)
            improvement = initial - loss
            accept = tf.logical_and(
                tf.logical_and(improvement > 0, expected > 0),
                improvement >= self._accept_ratio * fraction * expected)
            if self._max_kl is not None:
                accept = tf.logical_and(accept, kl <= self._max_kl)
            return tf.logical_and(accept, tf.math.is_finite(loss)), loss, kl

        def cond(index, fraction, accepted, loss, kl):
            del fraction, loss, kl
            return tf.logical_and(index < self._iterations, tf.logical_not(accepted))

        def body(index, fraction, accepted, loss, kl):
            del accepted, loss, kl
            fraction = tf.where(index > 0, fraction * self._backtrack_ratio, fraction)
            accepted, loss, kl = evaluate(fraction)
            return index + 1, fraction, accepted, loss, kl

        with tf.control_dependencies(tf.nest.flatten(diagnostics)):
            tried, fraction, accepted, loss, kl = tf.while_loop(
                cond, body, (tf.constant(0), tf.constant(1.0), tf.constant(False),
                             initial, tf.constant(0.0)))
        fraction = tf.where(accepted, fraction, 0.0)
        # Rejected: back to the start (the variables hold the last fraction tried).
        restored = tf.cond(accepted, lambda: tf.constant(0.0),
                           lambda: base.assign(variables, start))
        with tf.control_dependencies([restored]):
            applied = [fraction * delta for delta in deltas]
            ours = {
                "line_search/fraction": fraction,
                "line_search/accepted": tf.cast(accepted, tf.float32),
                "line_search/backtracks": tf.cast(
                    tried - tf.cast(accepted, tf.int32), tf.float32),
                "line_search/improvement": tf.where(accepted, initial - loss, 0.0)}
            if self._max_kl is not None:
                ours["line_search/kl"] = tf.where(accepted, kl, 0.0)
        return applied, dict(diagnostics, **ours)
