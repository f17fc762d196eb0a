"""scripts/parallel_step_benchmark.py on Pendulum with 4 environments, briefly.

No timing assertions (the machine may be busy): every kind runs and reports a positive
rate, and the policy stand-in (`--parent-work-us`) keeps the process busy that long.
"""

import functools
import os
import pathlib
import re
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import parallel_step_benchmark as benchmark  # noqa: E402

from batchrl import environments  # noqa: E402
from batchrl.environments.local import BatchEnv  # noqa: E402


def test_compute_keeps_the_process_busy_for_the_given_time():
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    benchmark.compute(20_000)
    wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    assert wall >= 0.02
    # Busy, not asleep (a sleep takes well under 1% of its wall time in CPU time); a share
    # of 10%, not 100%, since other processes may hold the cores.
    assert cpu > 0.1 * wall


def test_batch_steps_are_followed_by_the_parent_work():
    envs = [environments.create("Pendulum-v1") for _ in range(2)]
    stepper = benchmark.BatchStepper(BatchEnv(envs, blocking=True), 2, parent_work_us=20_000)
    try:
        start = time.perf_counter()
        assert stepper.call() == 2
        assert time.perf_counter() - start >= 0.02
    finally:
        stepper.close()


@pytest.mark.parametrize("num_groups", [2, 3])
def test_overlapped_groups_step_every_environment_and_end_their_workers(num_groups):
    constructor = functools.partial(environments.create, "Pendulum-v1")
    stepper = benchmark.Overlapped(constructor, 5, num_groups, parent_work_us=30)
    try:
        assert [len(rows) for rows in stepper.rows] == [len(rows) for rows in np.array_split(
            np.arange(5), num_groups)]
        assert len(stepper.processes) == min(num_groups, os.cpu_count())
        for _ in range(3):
            assert stepper.call() == 5
        # Every row holds a Pendulum observation [cos, sin, velocity] (the memory began as 0).
        observ = stepper.observ.copy()
        np.testing.assert_allclose(np.hypot(observ[:, 0], observ[:, 1]), 1.0, rtol=1e-5)
    finally:
        stepper.close()
    assert not any(process.is_alive() for process in stepper.processes)


def test_overlapped_rejects_more_groups_than_environments():
    constructor = functools.partial(environments.create, "Pendulum-v1")
    with pytest.raises(ValueError, match="overlap groups must be 1 to min"):
        benchmark.Overlapped(constructor, 3, 4, parent_work_us=0)


def test_every_kind_reports_a_positive_rate_with_parent_work(capsys):
    benchmark.main(["--envs", "Pendulum-v1", "--num-envs", "4", "--workers", "2",
                    "--rounds", "1", "--seconds", "0.1", "--warmup", "0.05",
                    "--parent-work-us", "100", "--overlap-groups", "2", "4"])
    out = capsys.readouterr().out
    assert "parent work 100 us per batch step" in out
    for kind in ("single_env", "plain_loops_2", "parallel_2", "batch_env_processes",
                 "async_vector_env", "overlapped_2", "overlapped_4"):
        match = re.search(rf"^  {kind} +([\d,]+) ", out, re.MULTILINE)
        assert match, f"{kind} missing from:\n{out}"
        assert int(match.group(1).replace(",", "")) > 0
