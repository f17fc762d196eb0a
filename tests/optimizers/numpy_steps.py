"""NumPy references of first-order optimizer steps on globally clipped gradients, for the
tests of `KerasOptimizer.apply` and of the algorithms' optimizers."""

import numpy as np


def global_norm(gradients):
    """The norm of all `gradients` (a list of arrays) as one vector."""
    return float(np.sqrt(sum(np.sum(np.square(g)) for g in gradients)))


def random_gradients(random, shapes, norms):
    """One list of float32 Gaussian arrays of `shapes` per entry of `norms`, scaled to that
    global norm."""
    steps = []
    for norm in norms:
        step = [random.normal(size=shape) for shape in shapes]
        scale = norm / global_norm(step)
        steps.append([(scale * g).astype(np.float32) for g in step])
    return steps


def clipped(gradients, max_norm):
    """The gradients scaled to the global norm `max_norm` when longer (None: unscaled;
    Pascanu et al. 2013, arXiv:1211.5063, algorithm 2), and their norm before."""
    norm = global_norm(gradients)
    scale = min(1.0, max_norm / norm) if max_norm else 1.0
    return [scale * g for g in gradients], norm


def adam_steps(start, gradients, max_norm, rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Adam (Kingma and Ba 2015, arXiv:1412.6980, algorithm 1, with epsilon added to
    sqrt(v) as Keras does) from `start` (list of arrays) on each step's gradients clipped
    to `max_norm`; returns the final values (float64) and each step's norm before
    clipping."""
    values = [np.asarray(value, np.float64) for value in start]
    m = [np.zeros_like(value) for value in values]
    v = [np.zeros_like(value) for value in values]
    norms = []
    for t, step in enumerate(gradients, 1):
        step, norm = clipped(step, max_norm)
        norms.append(norm)
        alpha = rate * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
        for i, g in enumerate(step):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            values[i] = values[i] - alpha * m[i] / (np.sqrt(v[i]) + epsilon)
    return values, norms


def momentum_steps(start, gradients, max_norm, rate, momentum):
    """SGD with momentum as Keras steps it (u <- momentum u - rate g; x <- x + u) from
    `start` on each step's gradients clipped to `max_norm`; returns the final values
    (float64) and each step's norm before clipping."""
    values = [np.asarray(value, np.float64) for value in start]
    velocity = [np.zeros_like(value) for value in values]
    norms = []
    for step in gradients:
        step, norm = clipped(step, max_norm)
        norms.append(norm)
        for i, g in enumerate(step):
            velocity[i] = momentum * velocity[i] - rate * g
            values[i] = values[i] + velocity[i]
    return values, norms
