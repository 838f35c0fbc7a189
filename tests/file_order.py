"""The order in which the suite's files go to pytest-xdist's workers: the longest first.

`--dist loadfile` hands each worker one file at a time, in the order of the collection, and the
next file to whichever worker finishes first. xdist's own order is by number of tests, so a long
file with few tests (test_slurm.py: 4 tests, 2.7 minutes) could start last and leave the other
worker idle for minutes. Longest first (`file_seconds.json`, each file's measured seconds) lets
the short files fill in at the end. The seconds only order the files: a stale figure costs time,
never a test.

Measure again after a file's time has moved a lot (python -m pytest with `-v --durations=0`;
any test command of the README's with those two flags), then:

    python tests/file_order.py LOG          # rewrites tests/file_seconds.json from that log
"""
import json
import pathlib
import re
import sys

SECONDS = pathlib.Path(__file__).with_name("file_seconds.json")
# One line of pytest's --durations report: "12.34s call     tests/test_x.py::test_y[...]".
_DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(?:\S*/)?(test_\w+\.py)::")


def file_seconds(durations_log: str) -> dict[str, float]:
  """Each file's seconds (setups, calls and teardowns) from a --durations=0 report."""
  seconds: dict[str, float] = {}
  for line in durations_log.splitlines():
    m = _DURATION.match(line)
    if m:
      seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
  return seconds


def key(nodeid: str, seconds: dict[str, float]) -> tuple[float, str]:
  """A test's place: its file's seconds, longest first (a file not in `seconds` last), then the
  file's name, which keeps files of equal seconds apart."""
  name = nodeid.split("::")[0].rsplit("/", 1)[-1]
  return -seconds.get(name, 0.0), name


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[str]:
  """`nodeids` with their files longest first; each file's tests stay together and in their
  own order (the sort is stable)."""
  return sorted(nodeids, key=lambda nodeid: key(nodeid, seconds))


def load() -> dict[str, float]:
  return json.loads(SECONDS.read_text())


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
    return 2
  seconds = file_seconds(pathlib.Path(argv[0]).read_text())
  if not seconds:
    print(f"{argv[0]}: no --durations lines in it (run pytest with -v --durations=0)",
          file=sys.stderr)
    return 1
  # A file whose every test took under 5 ms has no line (pytest hides those durations): it
  # keeps its figure, or a new one gets 0, so that it is still listed.
  files = sorted(p.name for p in SECONDS.parent.glob("test_*.py"))
  before = load() if SECONDS.exists() else {}
  hidden = [f for f in files if f not in seconds]
  for name in hidden:
    seconds[name] = before.get(name, 0.0)
  if hidden:
    print(f"no durations in the log for {hidden} (every test under 5 ms): kept as they were")
  ordered = dict(sorted(((k, round(v, 1)) for k, v in seconds.items()), key=lambda kv: -kv[1]))
  SECONDS.write_text(json.dumps(ordered, indent=1) + "\n")
  print(f"{SECONDS}: {len(ordered)} files, {sum(ordered.values()):.0f} s in all")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
