"""scripts/envpool_async_benchmark.py on Pendulum for a fraction of a second (no timing
assertions: the machine may be busy)."""

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import envpool_async_benchmark as benchmark  # noqa: E402


def test_every_layout_is_measured_against_sync():
    results = benchmark.measure("Pendulum-v1", 8, [(8, 4), (16, 8)], threads=1,
                                policy_us=1.0, seconds=0.3, window=0.05)
    assert list(results) == ["sync", "async 8/4", "async 16/8"]
    assert all(rate > 0 and ratio > 0 for rate, ratio in results.values())


def test_the_async_stepper_steps_every_environment_in_turn():
    call, pool = benchmark._async_stepper("Pendulum-v1", 4, 2, threads=1, policy_us=0.0)
    try:
        assert [call() for _ in range(6)] == [2] * 6
        # Each call steps the 2 environments EnvPool returned, so after 6 calls each of the
        # 4 has taken 3 steps (shown by the next 2 EnvPool returns).
        info = pool.recv()[-1]
        np.testing.assert_array_equal(info["elapsed_step"], [3, 3])
    finally:
        pool.close()


def test_command_line(capsys):
    assert benchmark.main(["--task", "Pendulum-v1", "--num-envs", "4", "--layouts", "4/2",
                           "--threads", "1", "--policy-us", "0", "--seconds", "0.2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Pendulum-v1, 1 EnvPool threads")
    assert "sync" in lines[1] and "async 4/2" in lines[2] and lines[2].endswith("x sync")
    with pytest.raises(SystemExit):
        benchmark.main(["--layouts", "4/8"])
