"""RLlib's APPO on CartPole-v1, timed: the peer that `benchmarks.rllib_appo` measures
batchrl's `cartpole_impala` beside. Run with the Python of a separate environment that has
`ray[rllib]` and torch (`benchmarks.rllib_appo` makes it); imports nothing of batchrl.

    PEER_PYTHON -m benchmarks.rllib_peer --seconds 300 --env-runners 2 --seed 0

Settings: those of RLlib's tuned example for APPO on CartPole-v1
(`rllib/tuned_examples/appo/cartpole_appo.py` in Ray's repository, not in its wheel: the
circular buffer's 2 iterations per batch, `vf_loss_coeff` 0.05, `entropy_coeff` 0, the
value function sharing the policy's layers; the rest RLlib's defaults), `--env-runners`
env runners and RLlib's learner actor, one logical CPU each, on a local Ray of this
machine's cores.

Prints one JSON object per line: `{"built": s}` (seconds from the start of this program
to a built algorithm: Ray's start, the env runners, the learner), then after each
`Algorithm.train()` call `{"seconds": s, "env_steps": n, "return": r}`: seconds since the
algorithm was built, env steps sampled so far (RLlib's
`num_env_steps_sampled_lifetime`), and the mean return of the episodes the env runners
finished recently (RLlib's `episode_return_mean`, None before the first; the sampling
policy's, not a separate evaluation). Stops at the first iteration that ends past
`--seconds`.
"""

import argparse
import json
import os
import time


def _find(result, key):
    """The value of `key` in RLlib's nested result dict (its env runners' metrics sit one
    level down), or None."""
    if key in result:
        return result[key]
    for value in result.values():
        if isinstance(value, dict):
            found = _find(value, key)
            if found is not None:
                return found
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rllib_peer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0,
                        help="training seconds after the algorithm is built")
    parser.add_argument("--env-runners", type=int, default=2, help="RLlib's env runners")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    import ray
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    # A Ray of its own (not one running here), with a logical CPU for each env runner and
    # one for the learner, which RLlib's APPO starts as a Ray actor of its own even with
    # `num_learners` 0 (with only the cores' 2 CPUs, it waits for one forever).
    ray.init(address="local", num_cpus=max(os.cpu_count(), args.env_runners + 1),
             include_dashboard=False, log_to_driver=False)
    config = (APPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=args.env_runners)
              .training(circular_buffer_iterations_per_batch=2, vf_loss_coeff=0.05,
                        entropy_coeff=0.0)
              .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
              .debugging(seed=args.seed))
    algorithm = config.build_algo()
    built = time.perf_counter()
    print(json.dumps({"built": built - start}), flush=True)
    while True:
        result = algorithm.train()
        seconds = time.perf_counter() - built
        episode_return = _find(result, "episode_return_mean")
        print(json.dumps({
            "seconds": seconds, "env_steps": _find(result, "num_env_steps_sampled_lifetime"),
            "return": None if episode_return is None else float(episode_return)}),
            flush=True)
        if seconds >= args.seconds:
            break
    algorithm.stop()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
