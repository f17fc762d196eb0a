"""A short fault-injection run in CI: a worker killed mid-run; the trainer SIGKILLed after
its first checkpoint and resumed; the trainer SIGKILLed inside a checkpoint write and
resumed; an environment whose `reset` raises mid-run (scripts/fault_injection.py does 20
random trials)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import fault_injection  # noqa: E402


def test_faults_leave_nothing_behind(tmp_path):
    output = tmp_path / "faults.md"
    code = fault_injection.main(["--trials", "4", "--faults", "kill", "sigkill", "sigkill-save",
                                 "raise-reset", "--output", str(output)])
    text = output.read_text()
    assert code == 0, text
    for line in ("hangs: 0", "leftover processes: 0", "unreadable checkpoints: 0",
                 "lost more than one checkpoint interval: 0", "unexpected outcome: 0"):
        assert line in text
