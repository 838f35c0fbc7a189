"""The linter: `ruff check` (configured in pyproject.toml) finds nothing in the tree."""
import ast
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
  proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", REPO],
                        capture_output=True, text=True, cwd=REPO, timeout=120)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_script_docstrings_with_continued_lines_are_raw():
  """A backslash ending a line of a plain docstring joins the lines: `--help` printed the usage
  examples of evaluate.py and trace_step.py run together (`newstest2014.en         --reference`)."""
  scripts = os.path.join(REPO, "scripts")
  joined = []
  for name in sorted(os.listdir(scripts)):
    if name.endswith(".py"):
      with open(os.path.join(scripts, name)) as f:
        source = f.read()
      segment = ast.get_source_segment(source, ast.parse(source).body[0]) or ""
      if segment.startswith(('"""', "'''")) and "\\\n" in segment:
        joined.append(name)
  assert not joined, f'make these docstrings raw (r"""...): {joined}'
