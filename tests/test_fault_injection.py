"""A short fault-injection run in CI: a worker killed mid-run; the trainer SIGKILLed after
its first checkpoint and resumed; the trainer SIGKILLed inside a checkpoint write and
resumed; an environment whose `reset` raises mid-run; and on the EnvPool backend NaN
actions, an action outside the action space and `env_kwargs` EnvPool cannot take
(`python -m benchmarks.faults` does 20 random trials)."""

from benchmarks.faults import injection as fault_injection

TOTALS = ("hangs: 0", "leftover processes: 0", "unreadable checkpoints: 0",
          "lost more than one checkpoint interval: 0", "unexpected outcome: 0")


def test_faults_leave_nothing_behind(tmp_path):
    output = tmp_path / "faults.md"
    code = fault_injection.main(["--trials", "4", "--faults", "kill", "sigkill", "sigkill-save",
                                 "raise-reset", "--output", str(output)])
    text = output.read_text()
    assert code == 0, text
    for line in TOTALS:
        assert line in text


def test_envpool_faults_leave_nothing_behind(tmp_path):
    output = tmp_path / "faults.md"
    code = fault_injection.main(["--backend", "envpool", "--trials", "3", "--faults",
                                 "nan-action", "bad-action", "bad-kwargs",
                                 "--output", str(output)])
    text = output.read_text()
    assert code == 0, text
    for line in TOTALS:
        assert line in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| yes |" in line]
    assert len(rows) == 3, text
    assert "was given a non-finite action: [nan]" in rows[0]
    assert "was given the action 2, outside the action space Discrete(2)" in rows[1]
