"""The error of a user's mistake in a config, shared by every floor (imports nothing)."""


class ConfigError(ValueError):
    """A user mistake in a config: the message names the culprit and the valid choices."""
