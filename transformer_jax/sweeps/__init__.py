"""Hyperparameter sweeps: the points a config's `sweep()` returns, their workdirs, how they run
and the report.

A config file defines, next to `get_config()`, a `sweep()` (or `sweep(arg)`) returning a list of
points, each a dict of config overrides with dotted names:

    from transformer_jax import sweeps

    def sweep():
      return sweeps.product(learning_rate=[1.0, 2.0], warmup_steps=[200, 400])

`scripts/sweep.py` runs each point as a `scripts/train.py` subprocess with `--config.X=value`
flags, in its own workdir named after its overrides.

  spec.py    building points, their names, reading a config file's sweep()
  runner.py  local subprocesses on disjoint devices; DONE/FAILED markers and status
  slurm.py   the same points as a SLURM array job
  report.py  the table and plot of a metric over the points, mean and spread over seeds
  compare.py the same table for runs no sweep made (scripts/compare_runs.py; not imported
             here: it draws on run/curves.py, which loads matplotlib)
"""
from transformer_jax.sweeps.report import (
    Evaluations,
    collect,
    lower_is_better,
    plot,
    report,
    seed_summary,
    sort_rows,
)
from transformer_jax.sweeps.runner import (
    DONE,
    FAILED,
    RUNNING,
    Runner,
    finished,
    recorded_config,
    slot_env,
    status,
)
from transformer_jax.sweeps.slurm import (
    SubmitError,
    array_spec,
    log_path,
    sbatch_script,
    submit,
    unfinished,
    write_sbatch,
)
from transformer_jax.sweeps.spec import (
    Point,
    Sweep,
    SweepError,
    apply_overrides,
    chain,
    cross,
    load_sweep,
    override_flags,
    point_dir,
    point_name,
    points_from_config,
    product,
    zipped,
)

__all__ = [
    "DONE", "Evaluations", "FAILED", "RUNNING", "Point", "Runner", "SubmitError", "Sweep",
    "SweepError",
    "apply_overrides", "array_spec", "chain", "collect", "cross", "finished", "load_sweep",
    "log_path", "lower_is_better", "override_flags", "plot", "point_dir", "point_name",
    "points_from_config", "product", "recorded_config", "report", "sbatch_script",
    "seed_summary", "slot_env",
    "sort_rows",
    "status", "submit", "unfinished", "write_sbatch", "zipped",
]
