"""The linter: `ruff check` (configured in pyproject.toml) finds nothing in the tree."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
  proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", REPO],
                        capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
