"""Each off-policy family learns a small task, and a broken update does not.

A short `train` run (seed 0, in this process) of DQN on CartPole and of SAC on
Pendulum, the tasks stepped in the graph (`batchrl.native_tasks`; for SAC the whole call
compiled with XLA, `jit_step`), must reach a threshold that a random policy is far from
(Gymnasium's environments, 1,000 / 100 episodes of uniform random actions, seed 0: CartPole
22.2, the best episode 76; Pendulum -1,208, the best -744) and that the broken updates
named in each test's docstring do not reach (measured by editing the code, running the
test and restoring the code).

A learning test cannot catch every broken update: some still learn these tasks (each test
says which). The update rules themselves are checked term by term against NumPy by the
unit tests of the updates.

SAC's run is the learning test of the continuous-action family. TD3's (pendulum_sac's
settings with TD3, 8k steps, one eval at the end: final eval -180.1 / -142.4, seeds 0 / 1;
it caught targets taken from the online actor and critics, -1,565.3 / -1,198.6 at 10k
steps) is a benchmark run: `batchrl-benchmark --configs pendulum_sac --steps 8000 --set
algorithm=td3`, with this module's `NATIVE_PENDULUM` items as more `--set`s. TD3's update
(the targets from the target networks, the clipped smoothing noise, the policy delay) is
checked against NumPy by tests/algorithms/test_td3_update.py, and its whole training call
by tests/algorithms/test_off_policy.py.
"""

from batchrl.scripts import train
from batchrl.scripts.events import read_scalars

# No `jit_step` for DQN: its 3-step windows gather from a variable (ResourceGatherNd),
# which XLA does not compile.
NATIVE_CARTPOLE = ["env=batchrl.native_tasks:CartPole", "steps_per_call=100"]
NATIVE_PENDULUM = ["env=batchrl.native_tasks:Pendulum", "jit_step=true", "steps_per_call=200"]


def _evals(tmp_path, config, sets):
    """Trains `config` (seed 0) with the `--set` items `sets`; returns its eval returns."""
    logdir = tmp_path / "run"
    argv = [f"--config={config}", f"--logdir={logdir}", "--no-progress", "--set", "seed=0"]
    assert train.main(argv + [item for key in sets for item in ("--set", key)]) == 0
    scores = [scalar.value for scalar in read_scalars(logdir / "eval", "mean_score")]
    assert scores, "no eval was written"
    return scores


def _train_returns(tmp_path):
    """The train returns (exploring policy) of the run of `_evals`."""
    return [scalar.value for scalar in read_scalars(tmp_path / "run" / "train", "mean_score")]


def test_dqn_learns_cartpole_and_explores_less_as_it_learns(tmp_path):
    """cartpole_dqn's update (3-step double-Q targets, a target network copied every 250
    updates, the Huber loss) with a [64, 64] network on 200-step episodes, 10k steps
    (epsilon reaches its final 0.04 at 8k): final eval 192.9 / 180.8, last train return
    191.4 / 171.8 (seeds 0 / 1; at 20k steps: eval 180.8 / 196.8 / 200.0, train return
    194.2 / 196.8 / 200.0, seeds 0 / 1 / 2).

    Caught (at 20k steps): targets from the online network (eval 9.2-9.6 at every eval,
    seeds 0 and 1; train return 9.5, seed 1); epsilon's schedule reversed, rising to 1
    (train return 21.3 / 21.1, a random policy's; the greedy eval, learned off-policy from
    those steps, ends at 139.9 / 198.1). Not caught: the squared loss in place of Huber's
    (eval 200.0 at every eval, seed 0)."""
    scores = _evals(tmp_path, "cartpole_dqn", NATIVE_CARTPOLE + [
        "value_layers=[64,64]", "value_lr=0.001", "max_length=200", "steps=10000",
        "eval_every=5000", "log_every=2500"])
    assert scores[-1] >= 150, scores
    assert _train_returns(tmp_path)[-1] >= 150


def test_sac_learns_pendulum(tmp_path):
    """pendulum_sac's settings, 5k steps, one eval at the end: final eval -167.2 / -156.8
    (seeds 0 / 1; at 6k steps, evals every 2k: -131.4 / -173.5 / -204.4, seeds 0 / 1 / 2).

    Caught (at 6k steps): the entropy term's sign flipped in the actor's loss (-1,415.4 /
    -1,556.7, seeds 0 and 1). Not caught: the max of the twin target Qs in place of their
    min (-130.2 / -171.7) and the entropy term's sign flipped in the critic's target
    (-131.1 / -172.2)."""
    scores = _evals(tmp_path, "pendulum_sac", NATIVE_PENDULUM + [
        "steps=5000", "eval_every=5000"])
    assert scores[-1] >= -400, scores

