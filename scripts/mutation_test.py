"""Mutation testing of the core: which one-line bugs would the test suite let through?

  python scripts/mutation_test.py --out /tmp/mutation                 # every core module
  python scripts/mutation_test.py --out /tmp/mutation --modules all   # every module (hours)
  python scripts/mutation_test.py --out /tmp/mutation --modules losses,optim
  python scripts/mutation_test.py --out /tmp/mutation --report        # the report again
  python scripts/mutation_test.py --out /tmp/mutation --modules search --since main  # a change
  python scripts/mutation_test.py --out /tmp/mutation --retest        # survivors, after new tests
  python scripts/mutation_test.py --equivalent > docs/equivalent_mutants.md   # the skipped list

cosmic-ray (chosen over mutmut: it runs each mutant's tests in a fresh process, so JAX never
forks with its thread pools running and no jit cache outlives a mutant) seeds one bug at a time
into a copy of the tree and runs the tests that tests/mutation/config.toml lists for the module.
`--workers` copies of the tree run side by side, each taking every n-th mutant of every module.
The copies share a JAX compilation cache: a mutant that leaves the compiled program unchanged
loads it instead of compiling again. The unmutated tests run once under coverage first, and each
mutant runs the tests that execute its lines before the whole list (scripts/mutation_select.py;
`--no_select` runs the whole list only).

Writes under --out: report.md and report.json (killed / survived / timeout / skipped per module
and the score), survivors/<module>.diff (every surviving mutant as a diff), sessions/ (the
cosmic-ray databases, which `cr-report` also reads) and work<i>/ (the copies).
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
import platform
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib

from cosmic_ray.ast import get_ast
from cosmic_ray.commands import init as cr_init
from cosmic_ray.plugins import get_operator
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult
import mutation_select  # scripts/ is on sys.path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "tests" / "mutation" / "config.toml"


def load_config(path: Path = CONFIG) -> dict:
  config = tomllib.loads(path.read_text())
  for name, module in config["modules"].items():
    for field in ("path", "tests"):
      if field not in module:
        raise SystemExit(f"{path}: [modules.{name}] has no `{field}`; see the other modules")
    if not (REPO / module["path"]).exists():
      raise SystemExit(f"{path}: [modules.{name}] path {module['path']} does not exist")
  stray = sorted(set(config.get("core", [])) - set(config["modules"]))
  if stray:
    raise SystemExit(f"{path}: core lists {stray}, which are no [modules.<name>]")
  for i, entry in enumerate(config.get("equivalent", [])):
    missing = {"module", "line", "mutant", "reason"} - set(entry)
    if missing or entry["module"] not in config["modules"]:
      raise SystemExit(f"{path}: equivalent entry {i} ({entry}) needs module (one of "
                       f"{sorted(config['modules'])}), line, mutant and reason")
  return config


def module_names(config: dict, modules: str, default: str = "core") -> list[str]:
  """`--modules`: `all` for every module, or names; empty for `default` (config.toml's `core`
  list for a run; `all` for --report and --retest, which take the modules run into --out)."""
  if modules == "all" or not modules and default == "all":
    return list(config["modules"])
  names = [n for n in modules.split(",") if n] or list(config["core"])
  unknown = set(names) - set(config["modules"])
  if unknown:
    raise SystemExit(f"--modules: {sorted(unknown)} not in {CONFIG}; "
                     f"known: all, or {sorted(config['modules'])}")
  return names


def annotation_spans(code: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
  """Where the type annotations are: with `from __future__ import annotations` they never run."""
  spans = []
  for node in ast.walk(ast.parse(code)):
    parts = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
      parts.append(node.returns)
    if isinstance(node, ast.arg) and node.annotation:
      parts.append(node.annotation)
    if isinstance(node, ast.AnnAssign):
      parts.append(node.annotation)
    spans += [((p.lineno, p.col_offset), (p.end_lineno, p.end_col_offset)) for p in parts]
  return spans


def mutant_lines(code: str, mutation) -> tuple[str, str]:
  """The source line and the same line mutated, both stripped: how a mutant is named."""
  return _mutant_lines(code, mutation.operator_name, mutation.occurrence,
                       mutation.start_pos[0],
                       json.dumps(mutation.operator_args or {}, sort_keys=True))


@functools.lru_cache(maxsize=4096)  # classify and the equivalent-mutant check name one twice
def _mutant_lines(code: str, operator_name: str, occurrence: int, line: int,
                  operator_args: str) -> tuple[str, str]:
  # cosmic-ray's mutate_code without a walk of the module per mutant: the operator's mutation
  # points are listed once per module (in cosmic-ray's order, which numbers the occurrences),
  # and the one node is mutated in a copy and spliced into the source. The same lines as
  # mutate_code for all 7,300 mutants of the modules with equivalents (2026-11-28), 100x faster.
  before = code.splitlines()[line - 1].strip()
  operator, points = _mutation_points(code, operator_name, operator_args)
  if occurrence >= len(points):
    return before, before
  node, index = points[occurrence]
  parent, node.parent = node.parent, None  # a deep copy of the node alone, not of the tree
  try:
    twin = copy.deepcopy(node)
  finally:
    node.parent = parent
  twin.parent = parent
  mutated = operator.mutate(twin, index)
  starts = [0]
  for text in code.splitlines(keepends=True):
    starts.append(starts[-1] + len(text))
  (row_a, col_a), (row_b, col_b) = node.get_start_pos_of_prefix(), node.end_pos
  code = (code[:starts[row_a - 1] + col_a]
          + (mutated.get_code(include_prefix=True) if mutated is not None else "")
          + code[starts[row_b - 1] + col_b:])
  return before, code.splitlines()[line - 1].strip()


@functools.lru_cache(maxsize=64)
def _mutation_points(code: str, operator_name: str, operator_args: str):
  """The operator and every (node, index) it can mutate in `code`, in the order of cosmic-ray's
  walk (a node before its children), which is the order its occurrences are numbered in."""
  operator = get_operator(operator_name)(**json.loads(operator_args))
  points = []

  def walk(node):
    points.extend((node, index) for index, _ in enumerate(operator.mutation_positions(node)))
    for child in getattr(node, "children", []):
      walk(child)
  walk(_tree(code))
  return operator, points


@functools.lru_cache(maxsize=4)
def _tree(code: str):
  """The module's parse tree, shared by every operator's walk: `_mutant_lines` mutates a copy
  of one node, never the tree."""
  return get_ast(code)


def classify(code: str, spans, mutation, config: dict, module: str) -> str | None:
  """Why a mutant is not run ('operator: ...', 'annotation: ...', 'equivalent: ...') or None."""
  if not any(re.match(p, mutation.operator_name) for p in config["operators"]["include"]):
    return "operator: not in [operators] include"
  pos = tuple(mutation.start_pos)
  if any(start <= pos < end for start, end in spans):
    return "annotation: never evaluated"
  source_line = code.splitlines()[mutation.start_pos[0] - 1].strip()
  entries = [e for e in config.get("equivalent", [])
             if e["module"] == module and e["line"] == source_line]
  if entries:  # only then mutate (a parse of the module) to see the mutated line
    before, after = mutant_lines(code, mutation)
    for entry in entries:
      if (entry["line"], entry["mutant"]) == (before, after):
        return f"equivalent: {entry['reason']}"
  return None


def lines_changed_since(revision: str, path: str, repo: Path = REPO) -> set[int]:
  """Lines of the working tree's `path` added or changed since git `revision` (git diff -U0)."""
  diff = subprocess.run(["git", "diff", "-U0", revision, "--", path], cwd=repo,
                        capture_output=True, text=True)
  if diff.returncode != 0:
    raise SystemExit(f"--since {revision}: git diff failed: {diff.stderr.strip()}")
  lines = set()
  for start, count in re.findall(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff.stdout, re.M):
    lines |= set(range(int(start), int(start) + (1 if count == "" else int(count))))
  return lines


def tree_files(root: Path = REPO) -> list[str]:
  """The files git knows (tracked, or new and not ignored) that are in the working tree."""
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                         check=True, capture_output=True, text=True).stdout.split("\0")
  return sorted(name for name in files if name and (root / name).is_file())


def copy_tree(dst: Path) -> list[str]:
  """`tree_files`, as they are in the working tree; returns their names."""
  if dst.exists():
    shutil.rmtree(dst)
  names = tree_files()
  for name in names:
    (dst / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / name, dst / name)
  return names


def copy_workers(out: Path, workers: int) -> str:
  """A fresh copy of the tree per worker (also dropping a mutant a killed run left applied);
  returns the `fingerprint` of what the first copy holds."""
  names = [copy_tree(out / f"work{w}") for w in range(workers)][0]
  return fingerprint(out / "work0", names)


def fingerprint(root: Path, names: list[str]) -> str:
  """A digest of the files `names` under `root` (names and contents) and of what else decides
  what the tests do and how long they take: the interpreter, the installed packages, the
  host, its cores and the JAX/CUDA platform variables. The same digest: a coverage pass and
  time limits measured on the one hold for the other."""
  packages = sorted(f"{d.metadata['Name']}=={d.version}"
                    for d in importlib.metadata.distributions())
  machine = [sys.executable, platform.node(), str(os.cpu_count()), *packages,
             *(f"{k}={os.environ.get(k)}" for k in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES"))]
  digest = hashlib.sha256("\0".join(machine).encode() + b"\0\0")
  for name in names:
    digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
  return digest.hexdigest()


def record_baseline(out: Path, timeouts: dict[str, float], tree: str) -> None:
  """sessions/tree.json: per module, the tree (`fingerprint`) its coverage pass and time limit
  were made on, and that limit; a later run of other modules into `out` keeps the others'."""
  path = out / "sessions" / "tree.json"
  recorded = recorded_baselines(out)
  recorded.update({n: {"tree": tree, "timeout": t} for n, t in timeouts.items()})
  path.write_text(json.dumps(recorded, indent=1) + "\n")


def recorded_baselines(out: Path) -> dict[str, dict]:
  path = out / "sessions" / "tree.json"
  return json.loads(path.read_text()) if path.exists() else {}


def test_command(module: dict) -> str:
  return shlex.join(mutation_select.pytest_command(sys.executable, module["tests"],
                                                   module.get("deselect", [])))


def session_config(module: dict, timeout: float, selection: Path | None = None) -> str:
  # cosmic-ray splits the command with shlex; TOML strings take JSON's escapes.
  # The copy's own mutation_select.py (cosmic-ray runs in the copy): editing the checkout's
  # scripts during a run changes nothing in it.
  command = (shlex.join([sys.executable, "scripts/mutation_select.py", str(selection)])
             if selection else test_command(module))
  return (f'[cosmic-ray]\nmodule-path = {json.dumps(module["path"])}\n'
          f'timeout = {float(timeout)}\nexcluded-modules = []\n'
          f'test-command = {json.dumps(command)}\n[cosmic-ray.distributor]\nname = "local"\n')


def init_mutants(db, module_path: str, root: Path) -> list:
  """Fill `db` with every mutant of `module_path` (relative to `root`, where cosmic-ray will
  apply them), sorted by operator and occurrence: the job ids are random per session."""
  cwd = os.getcwd()
  os.chdir(root)
  try:
    cr_init([Path(module_path)], db, {})
  finally:
    os.chdir(cwd)
  return sorted(db.work_items, key=lambda i: (i.mutations[0].operator_name,
                                              i.mutations[0].occurrence))


def draw(runnable: list[int], sample: int, seed: int, after_sample: int = 0) -> set[int]:
  """The mutants (indices) of a sample of `sample` with `seed`, less those that a sample of
  `after_sample` with the same seed draws: the rest of a smaller sample run before."""
  def first(n):
    return set(random.Random(seed).sample(runnable, min(n, len(runnable))))
  return first(sample) - first(after_sample)


def prepare(out: Path, config: dict, names: list[str], workers: int, timeouts: dict,
            sample: int | None = None, select: bool = False,
            since: str | None = None, seed: int = 0,
            after_sample: int = 0) -> list[list[Path]]:
  """One cosmic-ray session per module and worker; worker w runs every workers-th mutant
  (of `sample` drawn at random per module with `seed`, when given, less those that a sample
  of `after_sample` with the same seed draws; only those on lines changed since git revision
  `since`, when given)."""
  (out / "sessions").mkdir(parents=True, exist_ok=True)
  queues = [[] for _ in range(workers)]
  for name in names:
    module = config["modules"][name]
    # The module as the copies hold it (the mutants' and the coverage map's lines): kept for
    # the report and for mutation_select's diff, since the copies get mutated.
    code = (out / "work0" / module["path"]).read_text()
    (out / "sessions" / f"{name}.py").write_text(code)
    spans = annotation_spans(code)
    reasons = None  # the same for every worker's session: classified once
    for w in range(workers):
      toml_path = out / "sessions" / f"{name}.{w}.toml"
      selection = out / "sessions" / f"{name}.select.json" if select else None
      toml_path.write_text(session_config(module, timeouts[name], selection))
      db_path = out / "sessions" / f"{name}.{w}.sqlite"
      db_path.unlink(missing_ok=True)
      with use_db(str(db_path)) as db:
        # Sorted by what the mutant is, so worker w's shard is the same list in every session.
        items = init_mutants(db, module["path"], out / f"work{w}")
        if reasons is None:
          reasons = [classify(code, spans, item.mutations[0], config, name) for item in items]
          if since is not None:
            changed = lines_changed_since(since, module["path"])
            reasons = [r or (None if item.mutations[0].start_pos[0] in changed
                             else f"unchanged: line not changed since {since}")
                       for r, item in zip(reasons, items)]
          runnable = [i for i, reason in enumerate(reasons) if reason is None]
          if sample is not None and (sample < len(runnable) or after_sample):
            drawn = draw(runnable, sample, seed, after_sample)
            reasons = [r if i in drawn or r else "sample: not drawn"
                       for i, r in enumerate(reasons)]
            runnable = sorted(drawn)
        shard = list(reasons)
        for k, i in enumerate(runnable):
          if k % workers != w:
            shard[i] = f"shard: run by worker {k % workers}"
        skipped = {}
        for item, reason in zip(items, shard):
          if reason:
            skipped.setdefault(reason, []).append(item.job_id)
        for reason, job_ids in skipped.items():
          db.set_multiple_results(job_ids, WorkResult(output=reason,
                                                      worker_outcome=WorkerOutcome.SKIPPED))
      queues[w].append(toml_path)
  return queues


def environment(work: Path, out: Path) -> dict:
  # tests/mutation on the path for the coverage pass's plugin (-p pytest_plugin).
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), str(work / "tests" / "mutation")]),
             JAX_COMPILATION_CACHE_DIR=str(out / "jax_cache"))
  env.pop("XLA_FLAGS", None)  # tests/conftest.py sets the 8 fake devices
  return env


def listed(nodeid: str, specs: list[str]) -> bool:
  """Whether pytest argument `specs` (files, test ids) select test `nodeid`."""
  return any(nodeid == s or nodeid.startswith((s + "::", s + "[")) for s in specs)


def module_durations(module: dict, durations: dict[str, float]) -> dict[str, float]:
  """The tests of `durations` that `module`'s list runs."""
  return {t: d for t, d in durations.items()
          if listed(t, module["tests"]) and not listed(t, module.get("deselect", []))}


def coverage_groups(config: dict, names: list[str], workers: int) -> list[list[str]]:
  """The modules' test lists as one, split into up to `workers` pytest argument lists of about
  equal size (file size as the guess of time; a whole file in one group, so its module fixtures
  are set up once), each with the deselections that every module listing the test makes."""
  modules = [config["modules"][n] for n in names]
  specs = sorted({s for m in modules for s in m["tests"]})
  specs = [s for s in specs if not listed(s, [f for f in specs if "::" not in f and f != s])]
  deselect = sorted({d for m in modules for d in m.get("deselect", [])
                     if all(d in m2.get("deselect", []) for m2 in modules
                            if listed(d, m2["tests"]))})
  size = lambda s: (REPO / s).stat().st_size if "::" not in s else 5000  # noqa: E731
  groups: list[list[str]] = [[] for _ in range(min(workers, len(specs)))]
  weights = [0] * len(groups)
  for spec in sorted(specs, key=size, reverse=True):
    k = weights.index(min(weights))
    groups[k].append(spec)
    weights[k] += size(spec)
  return [g + [f"--deselect={d}" for d in deselect if listed(d, g)] for g in groups]


def check_copies(out: Path, workers: int) -> None:
  """Each copy's tests import the copy's package, or its mutants would not be tested."""
  for w in range(workers):
    work = out / f"work{w}"
    where = subprocess.run([sys.executable, "-c", "import transformer_jax as t; print(t.__file__)"],
                           cwd=work, env=environment(work, out), capture_output=True, text=True)
    if not where.stdout.startswith(str(work)):
      raise SystemExit(f"the copy in {work} imports transformer_jax from {where.stdout.strip()}"
                       f"{where.stderr[-2000:]}: mutants would not be tested")


def baseline(out: Path, config: dict, names: list[str], workers: int, select: bool = False,
             confirm: bool = True) -> dict[str, float]:
  """The listed tests pass on the unmutated copies, or every mutant would look killed. With
  `select`, they run under coverage (one context per test, tests/mutation/pytest_plugin.py),
  each test once however many modules list it, and each module gets
  sessions/<name>.select.json, the line -> tests map mutation_select reads."""
  check_copies(out, workers)

  def run(args):
    w, k, command = args
    work = out / f"work{w}"
    env, extra = environment(work, out), []
    if select:
      env.update(COVERAGE_FILE=str(out / "sessions" / f"coverage.{k}"),
                 MUTATION_DURATIONS=str(out / "sessions" / f"durations.{k}.json"))
      extra = ["--cov=transformer_jax", "--cov-context=test", "--cov-report=",
               "-p", "pytest_plugin"]
    print(f"baseline: {command}{' (under coverage)' if select else ''}", flush=True)
    start = time.time()
    done = subprocess.run(shlex.split(command) + extra, cwd=work, env=env, capture_output=True,
                          text=True)
    return command, done, time.time() - start

  (out / "sessions").mkdir(parents=True, exist_ok=True)
  if select:
    commands = [shlex.join(mutation_select.pytest_command(sys.executable, g, []))
                for g in coverage_groups(config, names, workers)]
  else:
    commands = sorted({test_command(config["modules"][n]) for n in names})
  seconds = {}
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    for command, done, took in pool.map(
        run, [(k % workers, k, c) for k, c in enumerate(commands)]):
      if done.returncode != 0:
        raise SystemExit(f"the unmutated tests fail; fix them first:\n{command}\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
      seconds[command] = took
  if select:
    durations = {}
    for k in range(len(commands)):
      durations.update(json.loads((out / "sessions" / f"durations.{k}.json").read_text()))
    data_files = [out / "sessions" / f"coverage.{k}" for k in range(len(commands))]
    for name in names:
      module = config["modules"][name]
      mine = module_durations(module, durations)
      lines = mutation_select.coverage_map(data_files, module["path"], mine)
      (out / "sessions" / f"{name}.select.json").write_text(json.dumps({
          "module_path": module["path"], "original": f"{name}.py", "tests": module["tests"],
          "deselect": module.get("deselect", []), "confirm": confirm, "durations": mine,
          "lines": lines}))
      seconds[test_command(module)] = sum(mine.values())
  # A mutant's time limit: 3x the unmutated tests' time (which compiled from an empty cache)
  # plus a minute for a busy machine, unless the config sets one; twice that when a survivor
  # runs its selected tests and then the whole list.
  runs = 2 if select and confirm else 1
  return {n: runs * config["modules"][n].get("timeout", round(3 * seconds[test_command(
      config["modules"][n])] + 60)) for n in names}


def execute_all(out: Path, queues: list[list[Path]]) -> None:
  """Each worker's queue of sessions, the workers side by side."""
  with concurrent.futures.ThreadPoolExecutor(len(queues)) as pool:
    list(pool.map(lambda wq: execute(out, *wq), enumerate(queues)))


def execute(out: Path, w: int, queue: list[Path]) -> None:
  work = out / f"work{w}"
  for toml_path in queue:
    db = toml_path.with_suffix(".sqlite")
    start = time.time()
    with open(out / "sessions" / f"{toml_path.stem}.log", "w") as log:
      subprocess.run([str(Path(sys.executable).with_name("cosmic-ray")), "exec", str(toml_path),
                      str(db)], cwd=work, env=environment(work, out), stdout=log,
                     stderr=subprocess.STDOUT, check=True)
    print(f"worker {w}: {toml_path.stem} done in {time.time() - start:.0f} s", flush=True)


def outcome(result: WorkResult) -> str:
  if result.worker_outcome == WorkerOutcome.SKIPPED:
    kind = result.output.split(":")[0]
    # or equivalent, shard, sample
    return "filtered" if kind in ("operator", "annotation") else kind
  if result.worker_outcome != WorkerOutcome.NORMAL:
    return "incompetent"  # the mutation could not be applied or the worker failed
  if result.test_outcome == TestOutcome.SURVIVED:
    return "survived"
  if result.test_outcome == TestOutcome.KILLED:
    timed_out = result.output == "timeout" or mutation_select.TIMED_OUT in (result.output or "")
    return "timeout" if timed_out else "killed"
  return "incompetent"


def module_results(out: Path, name: str) -> tuple[dict, list] | None:
  """(counts by outcome, survivors as (line, source line, mutated line, diff)) of `name`'s
  sessions in `out`, or None when it was not run there."""
  counts = dict.fromkeys(["killed", "timeout", "survived", "not_executed", "equivalent",
                          "incompetent", "pending", "filtered", "not_drawn", "unchanged"], 0)
  counts["since"] = None  # the --since revision, when it left mutants out
  seconds = []  # per mutant run, as mutation_select printed it
  survivors = []
  sessions = sorted((out / "sessions").glob(f"{name}.*.sqlite"))
  if not sessions:
    return None
  code = (out / "sessions" / f"{name}.py").read_text()  # as it was when mutated
  for first, db_path in zip([True] + [False] * len(sessions), sessions):
    with use_db(str(db_path), WorkDB.Mode.open) as db:
      results = dict(db.results)
      for item in db.work_items:
        result = results.get(item.job_id)
        kind = outcome(result) if result else "pending"
        kind = "not_drawn" if kind == "sample" else kind
        # Every session lists the skipped mutants: count those once.
        if kind in counts and (first or kind not in ("equivalent", "filtered", "not_drawn",
                                                     "unchanged")):
          counts[kind] += 1
        if kind == "unchanged":
          counts["since"] = result.output.rpartition(" since ")[2]
        took = re.search(r"^mutation_select: ([0-9.]+) s$", (result.output or "") if result
                         else "", re.M)
        if took:
          seconds.append(float(took.group(1)))
        if kind == "survived":
          # No listed test executes its lines in-process (the whole list still ran).
          counts["not_executed"] += mutation_select.NOT_EXECUTED in (result.output or "")
          before, after = mutant_lines(code, item.mutations[0])
          survivors.append((item.mutations[0].start_pos[0], before, after, result.diff))
  caught = counts["killed"] + counts["timeout"]
  run = caught + counts["survived"]
  counts["score"] = round(100 * caught / run, 1) if run else None
  # Worker-seconds in the mutants' tests (start-up included): a run's wall time is about their
  # sum over the workers, plus the coverage pass.
  counts["seconds"] = round(sum(seconds))
  counts["seconds_per_mutant"] = round(sum(seconds) / len(seconds), 1) if seconds else None
  return counts, sorted(survivors)


def mutants_run(c: dict) -> str:
  """How many of the module's mutants the run took, from module_results' counts: "34 (all)",
  or "3 of 34 (a sample)" and the like for a --sample or --since run."""
  ran = c["killed"] + c["timeout"] + c["survived"] + c["incompetent"] + c["pending"]
  changed = ran + c["not_drawn"]
  every = changed + c["unchanged"]
  if c["unchanged"] and c["not_drawn"]:
    return f"{ran} of {every} (a sample of the {changed} on lines changed since {c['since']})"
  if c["unchanged"]:
    return f"{ran} of {every} (on lines changed since {c['since']})"
  if c["not_drawn"]:
    return f"{ran} of {every} (a sample)"
  return f"{every} (all)"


def report(out: Path, config: dict, names: list[str]) -> dict:
  (out / "survivors").mkdir(parents=True, exist_ok=True)
  rows = {}
  for name in names:
    found = module_results(out, name)
    if found is None:
      continue  # not run into this --out
    rows[name], survivors = found
    with open(out / "survivors" / f"{name}.diff", "w") as f:
      for line, before, after, diff in survivors:
        f.write(f"# line {line}\n# line = {json.dumps(before)}\n# mutant = {json.dumps(after)}\n"
                f"{diff}\n\n")
  (out / "report.json").write_text(json.dumps(rows, indent=1))
  header = ("| module | mutants in the run | killed | timeout | survived | of which not "
            "executed | score % | equivalent | incompetent | pending | worker-s (per mutant) |")
  lines = [header, "|" + "---|" * 11]
  for name, c in rows.items():
    lines.append(f"| {name} | {mutants_run(c)} | {c['killed']} | {c['timeout']} | "
                 f"{c['survived']} | {c['not_executed']} | {c['score']} | {c['equivalent']} | "
                 f"{c['incompetent']} | {c['pending']} | {c['seconds']} "
                 f"({c['seconds_per_mutant']}) |")
  if any(c["not_drawn"] or c["unchanged"] for c in rows.values()):
    lines.append("\nA partial run (--sample, --since): its score is that of the mutants run "
                 "only.")
  (out / "report.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return rows


def apply_survivor(code: str, line: int, before: str, after: str) -> str | None:
  """`code` with the survivor's line (`before`, stripped, nearest to its old `line`) replaced by
  `after` at the same indentation; None when no line reads `before` any more."""
  lines = code.splitlines(keepends=True)
  found = [i for i, text in enumerate(lines) if text.strip() == before]
  if not found:
    return None
  i = min(found, key=lambda k: abs(k + 1 - line))
  indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
  lines[i] = indent + after + "\n"
  return "".join(lines)


def retest(out: Path, config: dict, names: list[str]) -> dict:
  """Run the survivors of the sessions in `out` again, on a fresh copy of the tree as it is now
  (after tests were added): each one killed now, still surviving, or gone (its line changed).
  Writes retest.md / retest.json; the score counts the first run's kills plus the new ones."""
  first = {n: module_results(out, n) for n in names}
  names = [n for n in names if first[n]]
  if not names:
    raise SystemExit(f"{out}: no sessions to retest; run the modules there first")
  again = out / "retest"
  copy_tree(again / "work0")
  timeouts = baseline(again, config, names, 1, select=True)
  work, rows = again / "work0", {}
  for name in names:
    module = config["modules"][name]
    path = work / module["path"]
    code = path.read_text()
    (again / "sessions" / f"{name}.py").write_text(code)  # the selection's diff base
    outcomes = {"killed": [], "survived": [], "gone": [], "equivalent": []}
    equivalent = {(e["line"], e["mutant"]) for e in config.get("equivalent", [])
                  if e["module"] == name}
    for line, before, after, _ in first[name][1]:
      if (before, after) in equivalent:  # listed since the first run
        outcomes["equivalent"].append((line, before, after))
        continue
      mutated = apply_survivor(code, line, before, after)
      if mutated is None:
        outcomes["gone"].append((line, before, after))
        continue
      path.write_text(mutated)
      try:
        done = subprocess.run([sys.executable, "scripts/mutation_select.py",
                               str(again / "sessions" / f"{name}.select.json")], cwd=work,
                              env=environment(work, again), capture_output=True, text=True,
                              timeout=timeouts[name])
        killed = done.returncode != 0
      except subprocess.TimeoutExpired:
        killed = True
      finally:
        path.write_text(code)
      outcomes["killed" if killed else "survived"].append((line, before, after))
      print(f"retest {name}:{line}: {'killed' if killed else 'survives'}: {after}", flush=True)
    c = first[name][0]
    caught = c["killed"] + c["timeout"] + len(outcomes["killed"])
    run = (c["killed"] + c["timeout"] + c["survived"] - len(outcomes["gone"])
           - len(outcomes["equivalent"]))
    rows[name] = {"first_run": c, **{k: len(v) for k, v in outcomes.items()},
                  "score": round(100 * caught / run, 1) if run else None,
                  "still_surviving": outcomes["survived"], "gone_mutants": outcomes["gone"]}
  (out / "retest.json").write_text(json.dumps(rows, indent=1))
  lines = ["| module | survivors of the first run | killed now | still surviving | "
           "equivalent now | gone | score now % |", "|" + "---|" * 7]
  for name, r in rows.items():
    lines.append(f"| {name} | {r['first_run']['survived']} | {r['killed']} | {r['survived']} | "
                 f"{r['equivalent']} | {r['gone']} | {r['score']} |")
  for name, r in rows.items():
    lines += [f"\n{name}, still surviving:"] + [f"- line {n}: `{b}` -> `{a}`"
                                                  for n, b, a in r["still_surviving"]]
  (out / "retest.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return rows


def resume(out: Path, config: dict, names: list[str]) -> None:
  """Run the mutants that the sessions in `out` left pending (a run stopped early: its results
  so far are kept) on fresh copies of the tree as it is now, so tests added since count; the
  mutated modules must read as they did, or the sessions' mutants would be other lines. The
  coverage pass runs again only if the tree or the machine changed since (`fingerprint`)."""
  sessions = {n: sorted((out / "sessions").glob(f"{n}.*.sqlite")) for n in names}
  names = [n for n in names if sessions[n]]
  if not names:
    raise SystemExit(f"{out}: no sessions to resume; run the modules there first")
  for name in names:
    path = config["modules"][name]["path"]
    if (REPO / path).read_text() != (out / "sessions" / f"{name}.py").read_text():
      raise SystemExit(f"{path} changed since the run in {out}: its pending mutants would be "
                       "other lines; start a new --out (and --retest the old one's survivors)")
  workers = {len(sessions[n]) for n in names}
  if len(workers) != 1:
    raise SystemExit(f"{out}: the modules were run with different --workers; resume them one "
                     "by one (--modules)")
  workers = workers.pop()
  pending = {n: module_results(out, n)[0]["pending"] for n in names}
  print("pending: " + ", ".join(f"{n} {k}" for n, k in pending.items()), flush=True)
  names = [n for n in names if pending[n]]
  if not names:
    return
  # The run's own choices: with a selection or without, confirming survivors or not.
  chosen = {n: out / "sessions" / f"{n}.select.json" for n in names}
  confirms = {json.loads(f.read_text())["confirm"] if f.exists() else None
              for f in chosen.values()}   # None: run with --no_select
  if len(confirms) != 1:
    raise SystemExit(f"{out}: the modules were run with different --no_select or "
                     "--trust_coverage; resume them one by one (--modules)")
  confirm = confirms.pop()
  tree = copy_workers(out, workers)
  recorded = recorded_baselines(out)
  if all(recorded.get(n, {}).get("tree") == tree for n in names):
    # Not a file, package or machine changed since the run's coverage pass: its selection
    # and time limits still hold.
    print("the tree is as the run left it: its coverage pass and time limits are reused",
          flush=True)
    check_copies(out, workers)
    timeouts = {n: recorded[n]["timeout"] for n in names}
  else:
    timeouts = baseline(out, config, names, workers, confirm is not None, bool(confirm))
    record_baseline(out, timeouts, tree)
  # Written again either way: they name the selection files by their path under `out`,
  # which may have moved since.
  queues = [[] for _ in range(workers)]
  for name in names:
    for w in range(workers):
      toml_path = out / "sessions" / f"{name}.{w}.toml"
      toml_path.write_text(session_config(config["modules"][name], timeouts[name],
                                          chosen[name] if confirm is not None else None))
      queues[w].append(toml_path)
  execute_all(out, queues)


def equivalent_markdown(config: dict) -> str:
  """docs/equivalent_mutants.md: the equivalent mutants of the config, by module, with reasons."""
  def code(text):  # inline code in a table cell
    return "`" + text.replace("|", "\\|") + "`"
  out = ["# Equivalent mutants", "",
         "The mutants of the core that change nothing observable, which the mutation run skips",
         "(`tests/mutation/config.toml`, `[[equivalent]]`; docs/testing.md). Written by",
         "`python scripts/mutation_test.py --equivalent > docs/equivalent_mutants.md`;",
         "`tests/test_mutation.py` fails when this file and the config differ.", ""]
  for name, module in config["modules"].items():
    entries = [e for e in config.get("equivalent", []) if e["module"] == name]
    out += [f"## `{module['path']}` ({len(entries)})", ""]
    if entries:
      out += ["| line | mutant | why it is equivalent |", "|---|---|---|"]
      out += [f"| {code(e['line'])} | {code(e['mutant'])} | {e['reason'].replace('|', '/')} |"
              for e in entries]
    else:
      out.append("None.")
    out.append("")
  return "\n".join(out)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", type=Path, help="where the copies and reports go (required but "
                      "for --equivalent)")
  parser.add_argument("--modules", default="",
                      help="comma-separated, or `all` for every module of tests/mutation/"
                           "config.toml; default: the core (its `core` list), and for --report "
                           "and --retest every module run into --out")
  parser.add_argument("--workers", type=int, default=2, help="copies of the tree run side by side")
  parser.add_argument("--sample", type=int, default=None,
                      help="run this many mutants per module, drawn at random (--seed)")
  parser.add_argument("--seed", type=int, default=0,
                      help="the sample's random seed (default 0): another seed draws another "
                           "sample, which may share mutants with the first")
  parser.add_argument("--after_sample", type=int, default=0,
                      help="leave out the mutants that --sample N with the same --seed draws: "
                           "--sample 90 --after_sample 40 runs the other 50 of a sample of 90 "
                           "(more of a sample run before)")
  parser.add_argument("--since", default=None,
                      help="only the mutants on lines changed since this git revision (a quick "
                           "check of a change; the rest are skipped, not counted)")
  parser.add_argument("--report", action="store_true", help="only write the report again")
  parser.add_argument("--equivalent", action="store_true",
                      help="print the equivalent mutants as Markdown (docs/equivalent_mutants.md)")
  parser.add_argument("--retest", action="store_true",
                      help="run the survivors of the sessions in --out again on the tree as it "
                           "is now (after new tests): retest.md")
  parser.add_argument("--resume", action="store_true",
                      help="run the mutants that the sessions in --out left pending (a run "
                           "stopped early) with that run's workers and selection, on the tree "
                           "as it is now (its coverage pass again only if a file, a package "
                           "or the machine changed); then the report")
  parser.add_argument("--no_select", action="store_true",
                      help="run each mutant against its module's whole test list (no coverage "
                           "pass, no selection)")
  parser.add_argument("--trust_coverage", action="store_true",
                      help="a mutant that the tests executing its lines do not catch survives "
                           "without the whole list confirming it (faster, may over-count)")
  args = parser.parse_args(argv)
  if args.after_sample and (args.sample is None or args.after_sample >= args.sample):
    parser.error(f"--after_sample {args.after_sample} needs a larger --sample (the mutants "
                 "of the larger sample that the smaller one did not draw are run)")
  given = [f for f, v in (("--sample", args.sample is not None), ("--after_sample",
                                                                   args.after_sample),
                            ("--since", args.since), ("--no_select", args.no_select),
                            ("--trust_coverage", args.trust_coverage)) if v]
  if args.resume and given:
    parser.error(f"--resume runs the rest of the run in --out with that run's own choices "
                 f"(workers, sample, selection): leave out {', '.join(given)}")
  config = load_config()
  if args.equivalent:
    print(equivalent_markdown(config), end="")
    return
  if args.out is None:
    parser.error("--out is required")
  names = module_names(config, args.modules,
                       "all" if args.report or args.retest or args.resume else "core")
  out = args.out.resolve()
  if args.retest:
    retest(out, config, names)
    return
  if args.resume:
    resume(out, config, names)
  elif not args.report:
    tree = copy_workers(out, args.workers)
    select = not args.no_select
    timeouts = baseline(out, config, names, args.workers, select, not args.trust_coverage)
    queues = prepare(out, config, names, args.workers, timeouts, args.sample, select,
                     args.since, args.seed, args.after_sample)
    record_baseline(out, timeouts, tree)   # for --resume, once the sessions exist
    execute_all(out, queues)
  report(out, config, names)


if __name__ == "__main__":
  main()
