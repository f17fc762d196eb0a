"""Building an optimizer from its declaration (`optimizer: {type: ..., ...}`)."""

from batchrl.optimizers import base, keras_optimizer
from batchrl.optimizers import spec as spec_lib
from batchrl.optimizers.clipped_step import ClippedStep
from batchrl.optimizers.line_search import LineSearch
from batchrl.optimizers.multi_step import MultiStep
from batchrl.optimizers.natural_gradient import NaturalGradient

_NOT_OPTIONS = ("type", "learning_rate", "max_gradient_norm") + spec_lib.WRAPPERS


def create(spec, learning_rate=None, max_gradient_norm=None, path="optimizer"):
    """The optimizer that `spec` declares (see `batchrl.optimizers.spec`).

    Args:
      spec: a declaration, e.g. `{"type": "natural_gradient", "max_kl": 0.01,
        "line_search": {"max_iterations": 10}}`.
      learning_rate: the learning rate of Keras optimizers that do not give their own.
      max_gradient_norm: the gradient clipping of Keras optimizers that do not give their
        own (None: no clipping).
      path: where the declaration stands, for the messages.

    Returns:
      A `batchrl.optimizers.base.Optimizer`. A `line_search` without its own `max_kl`
      keeps the KL within the `max_kl` of the natural gradient it wraps, if any.

    Raises:
      ValueError: a bad declaration, or a Keras optimizer without a learning rate.
    """
    return _create(spec_lib.check(spec, path), learning_rate, max_gradient_norm, path)


def _create(spec, learning_rate, max_gradient_norm, path):
    kind = spec["type"]
    if kind in spec_lib.KERAS_TYPES:
        rate = spec["learning_rate"] if spec["learning_rate"] is not None else learning_rate
        if rate is None:
            raise ValueError(f"{path!r} ({kind}) needs a learning_rate")
        options = {key: value for key, value in spec.items() if key not in _NOT_OPTIONS}
        optimizer = keras_optimizer.create(
            kind, rate, spec["max_gradient_norm"] or max_gradient_norm, **options)
    elif kind == "natural_gradient":
        optimizer = NaturalGradient(spec["max_kl"], spec["cg_iterations"], spec["damping"],
                                    spec["cg_residual_tolerance"])
    else:
        inner = _create(spec["optimizer"], learning_rate, max_gradient_norm,
                        f"{path}.optimizer")
        optimizer = _wrap(kind, inner, spec)
    for name in spec_lib.WRAPPERS:
        if name in spec and name != kind:
            optimizer = _wrap(name, optimizer, spec[name])
    return optimizer


def _wrap(kind, inner, options):
    if kind == "multi_step":
        return MultiStep(inner, options["steps"])
    if kind == "clipped_step":
        return ClippedStep(inner, options["max_norm"])
    max_kl = options["max_kl"] if options["max_kl"] is not None else _natural_max_kl(inner)
    return LineSearch(inner, options["max_iterations"], options["accept_ratio"],
                      options["backtrack_ratio"], max_kl)


def _natural_max_kl(optimizer):
    """The `max_kl` of the natural gradient that `optimizer` is or wraps, else None."""
    while not isinstance(optimizer, NaturalGradient):
        optimizer = getattr(optimizer, "optimizer", None)
        if not isinstance(optimizer, base.Optimizer):
            return None
    return optimizer.max_kl
