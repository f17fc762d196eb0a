"""The search spaces of `batchrl-tune`: `--search KEY=SPEC` and `--space FILE.yaml`
parsed into `Param`s, and checked against the config system before any trial starts
(the SPEC forms are in `batchrl.scripts.tune`'s docstring)."""

import dataclasses
import json
import math
import pathlib

import ruamel.yaml

from batchrl import configs

read_yaml = ruamel.yaml.YAML(typ="safe", pure=True).load  # YAML text -> value.
flow = json.dumps  # A value as one line of YAML (JSON is YAML): `[64, 64]`, `null`.


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config key; `kind` is float, log, int or cat."""

    key: str
    kind: str
    low: float = None
    high: float = None
    step: float = None
    choices: tuple = ()

    def suggest(self, trial):
        """Asks `trial` for a value; returns the config value. Optuna's categorical choices
        are the plain values as they are, lists and mappings as YAML text."""
        if self.kind == "cat":
            labels = [value if value is None or isinstance(value, bool | int | float | str)
                      else flow(value) for value in self.choices]
            return self.choices[labels.index(trial.suggest_categorical(self.key, labels))]
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1)
        return trial.suggest_float(self.key, self.low, self.high, step=self.step,
                                   log=self.kind == "log")

    def label(self, value):
        """The value as Optuna stores it (`suggest`'s inverse), for `enqueue_trial`; raises
        ConfigError when the value lies outside the space."""
        if self.kind == "cat":
            if value not in self.choices:
                raise configs.ConfigError(
                    f"{self.key} is {flow(value)} in the config, not one of {self.describe()}")
            return value if value is None or isinstance(value, bool | int | float | str) \
                else flow(value)
        if not isinstance(value, int | float) or not self.low <= value <= self.high:
            raise configs.ConfigError(
                f"{self.key} is {flow(value)} in the config, outside {self.describe()}")
        return value

    def describe(self):
        """The spec in a canonical form, e.g. `log:1e-05:0.001`, `cat:[64, 64],null`."""
        if self.kind == "cat":
            return "cat:" + ",".join(map(flow, self.choices))
        ends = [self.low, self.high] + ([self.step] if self.step is not None else [])
        return ":".join([self.kind, *map(flow, ends)])


def _number(text, kind, where):
    try:
        value = int(text) if kind == "int" else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        expected = "an integer" if kind == "int" else "a finite number"
        raise configs.ConfigError(f"{where}: {text!r} is not {expected}")
    return value


def parse_spec(key, spec, where=None):
    """Parses one search space, e.g. `log:1e-5:1e-3` (a list: a `cat` of its items).
    Raises ConfigError naming `where` (default: `--search KEY=SPEC`) and what is wrong."""
    where = where or f"--search {key}={spec}"
    if isinstance(spec, list):
        spec = "cat:" + ",".join(map(flow, spec))
    kind, _, rest = spec.strip().partition(":") if isinstance(spec, str) else ("", "", "")
    if kind == "cat":
        try:
            choices = read_yaml(f"[{rest}]") if rest.strip() else []
        except ruamel.yaml.YAMLError:
            raise configs.ConfigError(f"{where}: the values are not a YAML flow list") from None
        if not choices:
            raise configs.ConfigError(f"{where}: cat needs at least one value")
        return Param(key, "cat", choices=tuple(choices))
    if kind not in ("float", "log", "int"):
        raise configs.ConfigError(
            f"{where}: unknown kind {kind!r}; kinds: float:LOW:HIGH[:STEP], log:LOW:HIGH, "
            f"int:LOW:HIGH[:STEP], cat:A,B,...")
    parts = rest.split(":")
    if len(parts) not in ((2,) if kind == "log" else (2, 3)):
        form = "log:LOW:HIGH" if kind == "log" else f"{kind}:LOW:HIGH[:STEP]"
        raise configs.ConfigError(f"{where}: expected {form}")
    low, high, *step = (_number(text, kind, where) for text in parts)
    if low > high or kind == "log" and low <= 0 or step and step[0] <= 0:
        raise configs.ConfigError(f"{where}: needs LOW <= HIGH" + (
            ", LOW > 0" if kind == "log" else "") + (", STEP > 0" if step else ""))
    return Param(key, kind, low, high, step[0] if step else None)


def parse_search(pairs, space_file=None):
    """The `Param`s of `--search KEY=SPEC` strings and a `--space` YAML file; raises
    ConfigError for a malformed pair, a bad spec or a key given twice."""
    found = []
    if space_file:
        try:
            data = read_yaml(pathlib.Path(space_file).read_text())
        except (OSError, ruamel.yaml.YAMLError) as error:
            raise configs.ConfigError(f"--space {space_file}: {error}") from None
        if not isinstance(data, dict):
            raise configs.ConfigError(f"--space {space_file}: expected a mapping KEY: SPEC")
        found += [parse_spec(str(key), spec, f"--space {space_file}: {key}: {spec}")
                  for key, spec in data.items()]
    for pair in pairs or ():
        key, sep, spec = pair.partition("=")
        if not sep or not key.strip():
            raise configs.ConfigError(f"--search expects KEY=KIND:..., got {pair!r}")
        found.append(parse_spec(key.strip(), spec))
    keys = [param.key for param in found]
    if len(set(keys)) < len(keys):
        raise configs.ConfigError(f"a search key is given twice: {', '.join(keys)}")
    return found


def validate(config, sets, params):
    """Checks the config with `sets` and every searched value with `configs.load`; returns
    the base `Config` or raises ConfigError naming the culprit."""
    searched = {param.key for param in params}
    for key, option in (("seed", "--seeds"), ("steps", "--steps")):
        if key in searched or key == "seed" and key in sets:
            raise configs.ConfigError(f"config key {key!r}: give it with {option}")
    if searched & set(sets):
        raise configs.ConfigError(f"config keys both searched and --set: {searched & set(sets)}")
    base = configs.load(config, sets)
    for param in params:
        for value in param.choices or (param.low, param.high):
            try:
                checked = configs.load(config, {**sets, param.key: value})
            except configs.ConfigError as error:
                message = str(error).replace(" in --set", "")
                raise configs.ConfigError(f"--search {param.key}={param.describe()}: {message}") \
                    from None
            if checked.eval_episodes == 0 or base.eval_episodes == 0:
                raise configs.ConfigError("eval_episodes 0: a trial needs eval scores")
    return base
