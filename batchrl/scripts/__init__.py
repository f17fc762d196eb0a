"""Command-line programs and their building blocks (configs, networks, environments)."""
