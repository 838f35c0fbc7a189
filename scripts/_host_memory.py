"""Huge pages for the host memory XLA:CPU allocates: a script that imports this module first
starts again with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, before jax is imported.

Why: XLA:CPU allocates the buffers of every run of a compiled program anew, its temporaries
too, and frees them when the run ends. glibc's malloc maps such large blocks from the kernel
and unmaps them on free, so each run's buffers are fresh pages that the kernel faults in and
zeroes on first touch: in the CPU reference train step (`configs/cpu_reference.py`), about
70,000 minor page faults (4 KiB each) and 100 ms of system time a step. With the tunable, glibc
asks for transparent huge pages on the memory it maps (`madvise(MADV_HUGEPAGE)`), so the kernel
backs it with 2 MiB pages where it can: about 670 faults a step, and the step 14% faster in
interleaved rounds (docs/benchmarks.md, with the settings measured and not kept).

A glibc tunable is read once, when the process starts: hence the restart (`os.execve`: the same
process id, arguments and open files, the environment plus the tunable and a marker; before
anything is printed or read). Nothing happens when
- the script is imported rather than run (the tests load scripts as modules);
- GLIBC_TUNABLES already sets `glibc.malloc.hugetlb` (yours is kept; the processes the script
  starts inherit it), or the process is the restart itself (TRANSFORMER_JAX_RESTARTED);
- `TRANSFORMER_JAX_MALLOC=system` (glibc's defaults, for comparisons);
- the C library is not glibc 2.35 or later (no such tunable), or the kernel's transparent huge
  pages are off (`never` in /sys/kernel/mm/transparent_hugepage/enabled).

Only the standard library here: the restart comes before anything slow is imported.
"""
import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
ENV = "TRANSFORMER_JAX_MALLOC"
# Set on the restart: a process started by it never restarts again, whatever became of the
# tunable on the way (a C library that dropped it would otherwise restart the script forever).
RESTARTED = "TRANSFORMER_JAX_RESTARTED"
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the running glibc, None for another C library."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
  except (ValueError, OSError, AttributeError):  # not glibc, or no confstr at all
    return None
  major, minor = version.split(".")[:2]
  return (int(major), int(minor)) if name == "glibc" else None


def huge_pages_off(path: str = THP) -> bool:
  """Whether the kernel's transparent huge pages are off ("[never]"), or their mode unknown."""
  try:
    with open(path) as f:
      return "[never]" in f.read()
  except OSError:
    return True


def tunables(environ, libc: tuple[int, int] | None, thp_off: bool) -> str | None:
  """The GLIBC_TUNABLES to restart with, or None where nothing is to change (see above)."""
  choice = environ.get(ENV, "")
  if choice not in ("", "hugepages", "system"):
    sys.exit(f"error: {ENV}={choice!r}: expected 'hugepages' (the default) or 'system'")
  current = environ.get("GLIBC_TUNABLES", "")
  if choice == "system" or RESTARTED in environ or "glibc.malloc.hugetlb" in current:
    return None
  if (libc or (0, 0)) < (2, 35) or thp_off:
    return None
  return f"{current}:{TUNABLE}" if current else TUNABLE


def _run_as_script() -> bool:
  """Whether the program running is a script of this folder (not a test importing one)."""
  main = getattr(sys.modules.get("__main__"), "__file__", None)
  here = os.path.dirname(os.path.realpath(__file__))
  return bool(main) and os.path.dirname(os.path.realpath(main)) == here


if _run_as_script():
  _new = tunables(os.environ, glibc_version(), huge_pages_off())
  if _new is not None:
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, "GLIBC_TUNABLES": _new, RESTARTED: "1"})
