"""The KL that APPO's adaptive penalty adapts on, against the policy lag of the fragments
(docs/algorithms.md, APPO): KL(pi_old || pi) from the policy at the update's start, which
it adapts on, beside KL(mu || pi) from the behaviour policy, which it adapted on before.

    .venv/bin/python -m benchmarks.appo_kl_lag [--rounds 30] [--warmup 8]

Everything runs in this process, without Ray (as tests/distributed/test_actor_learner.py's
`StalePool`): `pendulum_appo` with `clip_ratio: null` (the KL penalty and its cut-off
instead of the clip), one `FragmentActor` and the learner. The learner first makes
`--warmup` updates on fragments of lag 0; the weights it has after each update are kept.
Then each of `--rounds` rounds takes, for each lag L of `LAGS`, a fragment acted with the
weights of L updates before the learner's (lag L; the lags interleaved, so that each sees
the same stage of training) and makes one update on it (`IMPALA.learn`), which reports
`kl`, the mean KL(pi_old || pi_new) over the fragment, and `behaviour_kl`, the mean
KL(mu || pi_new). The table gives their means over the rounds per lag, with their
standard errors (the standard deviation over the rounds / sqrt(rounds)). Both KLs are of
the same
updates, made with the penalty on KL(pi_old || pi): a learner whose penalty adapted on
KL(mu || pi) would have trained differently.
"""

import argparse
import os

LAGS = (0, 2, 4, 8)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.appo_kl_lag", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="updates per lag")
    parser.add_argument("--warmup", type=int, default=8, help="updates of lag 0 first")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    from batchrl import build, configs, environments
    from batchrl.distributed import actor as actor_lib
    from batchrl.distributed import fragment as fragment_lib

    config = configs.load("pendulum_appo", {"clip_ratio": None})
    learner = build.build(config, environments.create_batch(config)).algo
    actor = actor_lib.FragmentActor(config, 0)
    actor.build()
    history = [learner.actor.get_weights()]  # history[-1]: the learner's weights now.

    def update(lag):
        version = len(history) - 1 - lag
        fragment = actor.collect(version, history[version])["fragment"]
        result = learner.learn(fragment_lib.expand(fragment))
        history.append(learner.actor.get_weights())
        return {key: float(result[key]) for key in ("kl", "behaviour_kl")}

    for _ in range(args.warmup):
        update(0)
    measured = {lag: [] for lag in LAGS}
    for _ in range(args.rounds):
        for lag in LAGS:
            measured[lag].append(update(lag))
    actor.close()
    print(f"pendulum_appo, clip_ratio null, {config.envs_per_actor} x "
          f"{config.rollout_length} steps a fragment, {config.update_epochs} steps an "
          f"update; means over {args.rounds} updates per lag after {args.warmup}")
    print("| lag (updates) | KL(μ ‖ π_new), before | KL(π_old ‖ π_new), now |")
    print("|---|---|---|")
    for lag, rows in measured.items():
        cells = []
        for key in ("behaviour_kl", "kl"):
            values = np.array([row[key] for row in rows])
            error = values.std(ddof=1) / np.sqrt(len(values))
            cells.append(f"{values.mean():.4f} ± {error:.4f}")
        print(f"| {lag} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
