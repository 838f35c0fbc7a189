"""scripts/_host_memory.py: a script run as a program starts again with glibc's malloc asked for
transparent huge pages, once, with its arguments; where that cannot help or is not wanted,
nothing happens."""
import ast
import json
import os
import subprocess
import sys

import pytest

from transformer_jax.bench import common as bench_common

from scripts_under_test import load_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_config.py")
host_memory = load_script("_host_memory")
GLIBC = (2, 36)


@pytest.mark.parametrize("environ, libc, thp_off, expected", [
    ({}, GLIBC, False, "glibc.malloc.hugetlb=1"),
    ({}, (2, 35), False, "glibc.malloc.hugetlb=1"),
    # Tunables of one's own are kept, ours appended.
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, GLIBC, False,
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    ({"TRANSFORMER_JAX_MALLOC": "hugepages"}, GLIBC, False, "glibc.malloc.hugetlb=1"),
    # Already set (by the user, or by the restart itself): no second restart.
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, GLIBC, False, None),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, GLIBC, False, None),
    ({"TRANSFORMER_JAX_MALLOC": "system"}, GLIBC, False, None),
    # The restart never restarts again, even were the tunable lost on the way.
    ({"TRANSFORMER_JAX_RESTARTED": "1"}, GLIBC, False, None),
    # No such tunable before glibc 2.35, nor in another C library; nothing to ask of a kernel
    # whose huge pages are off.
    ({}, (2, 34), False, None),
    ({}, None, False, None),
    ({}, GLIBC, True, None),
])
def test_the_restart_adds_the_tunable_only_where_it_can_help(environ, libc, thp_off,
                                                             expected):
  assert host_memory.tunables(environ, libc, thp_off) == expected


def test_a_script_imported_by_a_test_does_not_restart():
  assert not host_memory._run_as_script()  # pytest's __main__, not a script of scripts/


def test_a_misspelt_choice_is_one_error_line():
  with pytest.raises(SystemExit, match=r"^error: TRANSFORMER_JAX_MALLOC='sytem': expected "
                                       r"'hugepages' \(the default\) or 'system'$"):
    host_memory.tunables({"TRANSFORMER_JAX_MALLOC": "sytem"}, GLIBC, False)


@pytest.mark.parametrize("text, off", [
    ("always [madvise] never\n", False),
    ("[always] madvise never\n", False),
    ("always madvise [never]\n", True),
])
def test_the_kernels_huge_page_mode_is_read_from_its_file(tmp_path, text, off):
  path = tmp_path / "enabled"
  path.write_text(text)
  assert host_memory.huge_pages_off(str(path)) is off
  assert host_memory.huge_pages_off(str(tmp_path / "missing")) is True


def test_this_c_library_is_recognised():
  name = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
  if not name or not name.startswith("glibc"):
    assert host_memory.glibc_version() is None
  else:
    assert host_memory.glibc_version() == tuple(int(x) for x in name.split()[1].split(".")[:2])


def test_a_script_run_as_a_program_restarts_with_its_arguments_and_the_tunable():
  # The benchmark's JSON records the GLIBC_TUNABLES its process ran with.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("GLIBC_TUNABLES", None)
  env.pop("TRANSFORMER_JAX_MALLOC", None)
  env.pop("TRANSFORMER_JAX_RESTARTED", None)
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "benchmark.py"), "--what", "train",
       "--config", TINY, "--steps", "1", "--warmup", "1", "--matmul_n", "64",
       "--matmul_seconds", "0"], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  record = json.loads(out.stdout.strip().splitlines()[-1])
  assert record["config_path"] == TINY and record["figures"]["steps_timed"] == 1
  expected = host_memory.tunables(env, host_memory.glibc_version(),
                                  host_memory.huge_pages_off())
  assert record["glibc_tunables"] == (expected or "")
  if expected is not None:
    assert expected == "glibc.malloc.hugetlb=1"


# The scripts that compile and run models, and the one that must run as the Flax example does.
MODEL_SCRIPTS = ("benchmark", "compare_precision", "evaluate", "plot_attention", "score",
                 "trace_step", "train", "translate")


def _imports(name: str) -> list[str]:
  with open(os.path.join(REPO, "scripts", f"{name}.py")) as f:
    tree = ast.parse(f.read())
  out = []
  for node in tree.body:
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      out.append(node.module)
  return out


@pytest.mark.parametrize("name", MODEL_SCRIPTS)
def test_each_model_script_imports_the_restart_before_jax_or_the_package(name):
  imports = _imports(name)
  first_heavy = next(i for i, m in enumerate(imports)
                     if m.split(".")[0] in ("jax", "flax", "transformer_jax", "numpy"))
  assert "_host_memory" in imports[:first_heavy], imports


def test_the_flax_baseline_runs_with_glibcs_defaults():
  assert "_host_memory" not in _imports("baseline_flax_wmt")


@pytest.mark.parametrize("text, mode", [
    ("always [madvise] never\n", "madvise"),
    ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"),
    ("no brackets\n", None),
    ("always madvise] never\n", None),
    ("always [madvise never\n", None),
])
def test_the_benchmarks_record_the_tunables_and_the_huge_page_mode(tmp_path, monkeypatch, text,
                                                                   mode):
  path = tmp_path / "enabled"
  path.write_text(text)
  assert bench_common.huge_pages_mode(str(path)) == mode
  assert bench_common.huge_pages_mode(str(tmp_path / "missing")) is None
  monkeypatch.setattr(bench_common, "huge_pages_mode", lambda: mode)
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
  assert bench_common.host_paging() == (
      f"glibc.malloc.hugetlb=1; transparent huge pages: {mode or 'unknown'}")
  record = bench_common.environment()
  assert (record["glibc_tunables"], record["transparent_hugepages"]) == (
      "glibc.malloc.hugetlb=1", mode)
  monkeypatch.delenv("GLIBC_TUNABLES")
  assert bench_common.host_paging().startswith("glibc's defaults (no GLIBC_TUNABLES); ")
  assert bench_common.environment()["glibc_tunables"] == ""
