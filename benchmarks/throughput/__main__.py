"""`python -m benchmarks.throughput [OPTIONS]`: steps/s against baselines (`command`);
`python -m benchmarks.throughput breakdown [OPTIONS]`: where a training run's time goes
(`breakdown`). Each part is imported only when chosen: `breakdown`'s worker times its
process's start-up."""

import sys


def main(argv=None):
    """Runs the part that `argv` (default: `sys.argv[1:]`) chooses; returns its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["breakdown"]:
        from benchmarks.throughput import breakdown

        return breakdown.main(argv[1:])
    from benchmarks.throughput import command

    return command.main(argv)


if __name__ == "__main__":
    sys.exit(main())
