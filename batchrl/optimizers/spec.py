"""Checking optimizer declarations (`optimizer: {type: ..., ...}` in a config), free of
TensorFlow so that configs are checked before it starts.

A declaration is a mapping with a `type` and that type's keys; keys left out take their
defaults. The wrappers `line_search`, `multi_step` and `clipped_step` either stand on their
own (`{type: multi_step, steps: 5, optimizer: {type: adam}}`) or are written as a key of
the optimizer they wrap (`{type: natural_gradient, line_search: {max_iterations: 10}}`);
written as keys, they wrap in the order clipped_step (innermost), line_search, multi_step.
"""

import difflib

# For each type: key -> (default, kind); `REQUIRED` marks keys without a default.
REQUIRED = object()
_LEARNING_RATE = (None, "optional_positive")  # None: the config's policy_lr or value_lr.
_CLIP = (None, "optional_positive")  # None: the config's max_gradient_norm.
_ADAM = {"learning_rate": _LEARNING_RATE, "beta_1": (0.9, "fraction"),
         "beta_2": (0.999, "fraction"), "epsilon": (1e-7, "positive"),
         "max_gradient_norm": _CLIP}
SCHEMAS = {
    "adam": _ADAM,
    "radam": _ADAM,  # Rectified Adam (batchrl.optimizers.radam): the same keys.
    "sgd": {"learning_rate": _LEARNING_RATE, "momentum": (0.0, "fraction"),
            "nesterov": (False, "bool"), "max_gradient_norm": _CLIP},
    "rmsprop": {"learning_rate": _LEARNING_RATE, "rho": (0.9, "fraction"),
                "momentum": (0.0, "fraction"), "epsilon": (1e-7, "positive"),
                "centered": (False, "bool"), "max_gradient_norm": _CLIP},
    "natural_gradient": {"max_kl": (0.01, "positive"), "cg_iterations": (10, "positive_int"),
                         "damping": (0.1, "non_negative"),
                         "cg_residual_tolerance": (1e-10, "non_negative")},
    "line_search": {"optimizer": (REQUIRED, "spec"), "max_iterations": (10, "positive_int"),
                    "accept_ratio": (0.1, "non_negative"), "backtrack_ratio": (0.5, "fraction"),
                    "max_kl": (None, "optional_positive")},
    "multi_step": {"optimizer": (REQUIRED, "spec"), "steps": (REQUIRED, "positive_int")},
    "clipped_step": {"optimizer": (REQUIRED, "spec"), "max_norm": (REQUIRED, "positive")},
}
KERAS_TYPES = ("adam", "radam", "sgd", "rmsprop")
# Wrappers that may be written as a key of the optimizer they wrap, innermost first.
WRAPPERS = ("clipped_step", "line_search", "multi_step")


def _suggest(word, choices):
    close = difflib.get_close_matches(str(word), list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _check_kind(path, value, kind):
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "spec":
        return check(value, path)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{path!r} must be true or false, got {value!r}")
        return value
    if kind == "positive_int":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{path!r} must be a positive integer, got {value!r}")
        return value
    if kind == "optional_positive" and value is None:
        return None
    if not number:
        raise ValueError(f"{path!r} must be a number, got {value!r}")
    value = float(value)
    if kind in ("positive", "optional_positive") and not value > 0:
        raise ValueError(f"{path!r} must be positive, got {value!r}")
    if kind == "non_negative" and not value >= 0:
        raise ValueError(f"{path!r} must not be negative, got {value!r}")
    if kind == "fraction" and not 0 <= value < 1:
        raise ValueError(f"{path!r} must be in [0, 1), got {value!r}")
    return value


def check(spec, path="optimizer"):
    """Checks an optimizer declaration and fills in the defaults.

    Args:
      spec: a dict with `type` (one of `SCHEMAS`) and that type's keys; wrappers
        (`WRAPPERS`) may appear as keys holding their own keys (without `optimizer`).
      path: where the declaration stands, for the messages (e.g. the config key).

    Returns:
      A new dict of the same form with every default filled in (numbers as floats where
      the key is a real number).

    Raises:
      ValueError: a one-line message naming the culprit (`'optimizer.line_search' has
        unknown key 'max_iter' (did you mean max_iterations?)`, an unknown type, a wrong
        type or range of a value, a missing required key).
    """
    if not isinstance(spec, dict) or not all(isinstance(key, str) for key in spec):
        raise ValueError(f"{path!r} must be a mapping with a 'type', got {spec!r}")
    kind = spec.get("type")
    if kind not in SCHEMAS:
        what = "has no 'type'" if kind is None else f"has unknown type {kind!r}"
        raise ValueError(f"{path!r} {what}{_suggest(kind, SCHEMAS)}; "
                         f"choices: {', '.join(sorted(SCHEMAS))}")
    return _check_keys(spec, kind, path, nested=False)


def _check_keys(spec, kind, path, nested):
    """Checks the keys of one level: `kind`'s own keys and the wrapper keys."""
    schema = dict(SCHEMAS[kind])
    if nested:  # A wrapper written as a key wraps the optimizer it is a key of.
        del schema["optimizer"]
    wrappers = () if nested else tuple(name for name in WRAPPERS if name != kind)
    valid = set(schema) | set(wrappers) | ({"type"} if not nested else set())
    result = {} if nested else {"type": kind}
    for key in spec:
        if key not in valid:
            raise ValueError(f"{path!r} has unknown key {key!r}{_suggest(key, valid)}; "
                             f"valid keys: {', '.join(sorted(valid))}")
    for key, (default, key_kind) in schema.items():
        where = f"{path}.{key}"
        if key not in spec:
            if default is REQUIRED:
                raise ValueError(f"{path!r} needs the key {key!r}")
            result[key] = default
        else:
            result[key] = _check_kind(where, spec[key], key_kind)
    for name in wrappers:
        if name in spec:
            where = f"{path}.{name}"
            if not isinstance(spec[name], dict):
                raise ValueError(f"{where!r} must be a mapping of its keys, got {spec[name]!r}")
            result[name] = _check_keys(spec[name], name, where, nested=True)
    return result

