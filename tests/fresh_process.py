"""Checks that must run in a Python process of their own (what an import starts, the first
access of a name)."""

import subprocess
import sys


def check_in_fresh_process(code, *options):
    """Runs the Python statements `code` in a new interpreter (with interpreter `options`
    such as "-W", "ignore::DeprecationWarning"); fails with the end of its stderr unless it
    exits 0."""
    result = subprocess.run([sys.executable, *options, "-c", code], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
