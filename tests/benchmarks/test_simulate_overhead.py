"""benchmarks/simulate_overhead.py: a brief run on 2 Pendulums (no timing is asserted but
that the whole `simulate` takes longer between two environment calls than the bare
`tf.numpy_function` loop, which it contains, by far more than the host's noise)."""

from benchmarks import simulate_overhead


def test_layers_are_measured_and_the_whole_simulate_costs_the_most(capsys):
    assert simulate_overhead.main(["--num-envs", "2", "--steps-per-call", "5",
                                   "--calls", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Pendulum-v1, 2 environments, 5 steps per call, 3 calls")
    micros = {line[:34].strip(): float(line[34:].split()[0]) for line in lines[1:6]}
    assert list(micros) == ["environment step", "_step's Python",
                            "numpy_function between calls",
                            "batch variables between calls", "simulate between calls"]
    assert all(value > 0 for value in micros.values()), micros
    assert micros["simulate between calls"] > micros["numpy_function between calls"], micros
    ratio = float(lines[6].rsplit(" ", 1)[1])
    step = micros["environment step"]
    assert abs(ratio - step / (step + micros["_step's Python"]
                               + micros["simulate between calls"])) < 2e-3
