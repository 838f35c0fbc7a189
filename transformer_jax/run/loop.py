"""The training loop: `train_and_evaluate(config, workdir)`.

Resumes automatically from `<workdir>/checkpoints` (state, RNG and data iterator position), so a
resumed run sees exactly the batches and losses of an uninterrupted one. SIGTERM/SIGINT finish
the current step, save, and return. A non-finite loss stops the run before anything is saved.
`config.early_stopping_patience` ends a run whose keep_best metric stopped improving: that step
saved, the run finished (run/early_stopping.py).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shlex

import jax
import ml_collections

from transformer_jax import experiment, flops, sharding
from transformer_jax.config import TransformerConfig
from transformer_jax.run import best as best_lib
from transformer_jax.run import distributed, early_stopping
from transformer_jax.run import metrics as metrics_lib
from transformer_jax.run import workdir as workdir_lib
from transformer_jax.run.throughput import ThroughputMeter
from transformer_jax.run.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class Cadence:
  """What happens after a step: logging, saving, evaluating, BLEU. The final step does all."""

  num_train_steps: int
  log_every: int
  checkpoint_every: int
  eval_every: int
  bleu_every: int

  @classmethod
  def from_config(cls, c) -> "Cadence":
    return cls(c.num_train_steps, c.log_every_steps, c.checkpoint_every_steps,
               c.eval_every_steps, c.bleu_every_steps)

  def is_final(self, step: int) -> bool:
    return step == self.num_train_steps

  def log(self, step: int) -> bool:
    return self.is_final(step) or step % self.log_every == 0

  def save(self, step: int) -> bool:
    return self.is_final(step) or step % self.checkpoint_every == 0

  def evaluate(self, step: int) -> bool:
    return self.is_final(step) or step % self.eval_every == 0

  def bleu(self, step: int) -> bool:
    return self.is_final(step) or step % self.bleu_every == 0

  def reads_stop(self, step: int, processes: int) -> bool:
    """Whether the stop flag (a signal's) is read after `step`: after every step in one process;
    with several at log steps only, as agreeing on it costs a host round trip."""
    return processes == 1 or self.log(step)


def _check_mesh_fits(config: ml_collections.ConfigDict) -> None:
  """config.mesh against the devices of this run (all processes'): a mesh that does not fit
  is the user's to change, not a traceback from deep in the step's setup."""
  count = jax.device_count()
  try:
    sharding.mesh_shape(dict(config.mesh), count)
  except ValueError as e:
    raise workdir_lib.RunError(
        f"{e} ({jax.devices()[0].platform}, all processes'): give axis sizes "
        "whose product is the device count, or -1 for one axis to take the rest "
        "(--config.mesh.data=-1)") from None


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train (resuming if possible) until `config.num_train_steps`, or until early stopping ends
  the run; returns the last metrics (with `stopped_early`, the reason, when it did).

  In this order, so that a refused command writes nothing: a workdir inside another run is
  refused, the workdir is locked (one run at a time; process 0 holds the lock), the config is
  compared with the one the run was started with (`workdir.check_config`), and only then are
  data, tokenizer and state loaded and the config recorded. A first command refused after the
  lock removes the workdir it made, when nothing but the lock is in it.
  """
  experiment.validate(config)
  distributed.initialize(config)
  _check_mesh_fits(config)  # before the workdir, the lock or the tokenizer is written
  workdir_lib.refuse_inside_another_run(workdir)  # before a .lock is put in that run's files
  created = workdir_lib.missing_dirs(workdir)
  os.makedirs(workdir, exist_ok=True)
  lock = workdir_lib.Lock(workdir) if distributed.is_main() else None
  holder = lock.acquire() if lock else None
  if not distributed.from_main(holder is None):
    raise workdir_lib.WorkdirBusy(workdir_lib.busy_message(workdir, holder))
  try:
    stored, changes = workdir_lib.check_config(workdir, config)
    trainer = Trainer.create(config, workdir)
    run = _Run(trainer, workdir)
    if distributed.is_main():
      # Said when the run starts, where its config.json is written: a resume was told then.
      ignored = stored is None and trainer.data.vocab_settings_not_followed()
      if ignored:
        run.progress.write(f"warning: {ignored}")
      listed = "; ".join(f"{f}: {old!r} -> {new!r}" for f, old, new in changes)
      if run.finished:
        # Nothing runs with this config: recorded, it would become the run's own (a later
        # `train.py --workdir W` would train with it).
        if changes:
          run.progress.write(f"config changes on resume at step {run.step}, not recorded: "
                             f"the run is finished and nothing runs with them: {listed}")
      else:
        reverted = _reverted(workdir, changes)
        path = workdir_lib.record_config(workdir, config, trainer.model_cfg, run.step, stored,
                                         changes)
        forked = stored is None and config.init_from and workdir_lib.init_from_split_warning(
            config, workdir_lib.load_run_config(workdir).get(workdir_lib.RESOLVED_DATA, {}))
        if forked:
          run.progress.write(f"warning: {forked}")
        if changes:
          run.progress.write(f"config changes on resume at step {run.step}, recorded in "
                             f"{path} (the run's earlier configs are kept): {listed}")
        for line in reverted:
          run.progress.write(f"warning: {line}")
    return run.train()
  except BaseException:
    # A refused first command leaves no empty workdir holding a .lock behind.
    if lock and workdir_lib.remove_if_untouched(lock, created):
      lock = None
    raise
  finally:
    if lock:
      lock.release()


def _reverted(workdir: str, changes: list) -> list[str]:
  """A warning per earlier resume whose changes this command's config sets back to an older
  value (a scheduler re-running the original command after a `configs/resume.py` resume):
  allowed, but rarely meant."""
  history = workdir_lib.history(workdir)
  if not changes or not history:
    return []
  # The field values before the first resume and after each: config.json, config.<s>.json...
  configs = [(0, workdir_lib.recorded_values(workdir_lib.load_run_config(workdir, 0)))] + [
      (s, workdir_lib.recorded_values(workdir_lib.load_run_config(workdir, s + 1)))
      for s, _ in history]
  undone: dict[int, list[str]] = {}
  for field, now, new in changes:
    values = [c.get(field) for _, c in configs]
    # By position, not step: a resume at step 0 (before the first checkpoint) shares its step
    # with the run's start.
    changed = [i for i in range(1, len(values)) if values[i] != values[i - 1]]
    if changed and new in values[:changed[-1]]:
      undone.setdefault(configs[changed[-1]][0], []).append(
          f"{field} back to {new!r} (from {now!r})")
  w = shlex.quote(workdir)
  return [f"this command sets {', '.join(fields)}: it undoes the change made at the resume at "
          f"step {s} ({os.path.join(workdir, f'config.{s}.json')}). To keep the run's current "
          f"config, resume with python scripts/train.py --workdir {w} alone (and --config "
          f"{shlex.quote('configs/resume.py:' + workdir)} --config.<field>=... to change fields)"
          for s, fields in sorted(undone.items())]


class _Run:
  """One invocation of the loop: the trainer plus the metrics writer, progress bar and meter."""

  def __init__(self, trainer: Trainer, workdir: str):
    self.trainer, self.workdir, self.config = trainer, workdir, trainer.config
    self.cadence = Cadence.from_config(trainer.config)
    self.best = (best_lib.BestKeeper(workdir, self.config.keep_best, put_back=True)
                 if self.config.keep_best else None)
    self.state, saved_data, self.origin = trainer.initial_state()
    self.step = int(jax.device_get(self.state.step))
    self.batches = trainer.train_batches(saved_data)
    main = distributed.is_main()
    # Early stopping's count, replayed from metrics.jsonl's records up to the resumed step (the
    # later ones are about to be dropped): a resumed run stops where an uninterrupted one does,
    # and one resumed with a larger patience trains on. Process 0's count decides.
    patience = self.config.early_stopping_patience
    self.patience = early_stopping.from_records(
        self.config.keep_best, patience, metrics_lib.read_metrics(workdir) if main else [],
        self.step, self.config.early_stopping_min_delta) if patience else None
    self.stopped_early = distributed.from_main(
        self.patience is not None and self.patience.exhausted
        and self.step < self.config.num_train_steps)
    # A stop already on record: this command runs a stopped run again. Otherwise it stops the
    # run itself, where it resumes (a crash lost the record after the stop's save, or this
    # command's patience or keep_best is used up by the evaluations so far), and records its
    # config changes as a run that trains does.
    self.stop_recorded = self.stopped_early and distributed.from_main(
        main and early_stopping.stopped_at(workdir) == self.step)
    # Past num_train_steps with the final evaluation done, or stopped early before this
    # command: nothing trains or evaluates.
    self.finished = self.stop_recorded or (self.step >= self.config.num_train_steps
                                           and self._final_evaluation_done())
    # The oldest checkpoints beyond keep_checkpoints go first, before this command writes
    # anything (metrics.jsonl cut back to the resumed step, TensorBoard, a changed config):
    # Orbax would delete them only after the next save, and a full disk, the reason to lower
    # keep_checkpoints, held no page for any of those writes. Only when this command trains
    # (a save follows); every process calls it.
    gone = trainer.checkpointer.prune() if self._trains() else []
    # Records past the resumed step (logged before a crash, from steps that are now run again)
    # are dropped, so every step appears once in metrics.jsonl and TensorBoard.
    self.writer = metrics_lib.MetricsWriter(workdir, enabled=main, resume_step=self.step)
    self.progress = metrics_lib.Progress(self.config.num_train_steps, self.step, enabled=main)
    if gone and main:
      self.progress.write(
          f"deleted checkpoint(s) {gone} from {trainer.checkpointer.directory}: "
          f"keep_checkpoints={self.config.keep_checkpoints} (Orbax would delete them after the "
          "next save, which a full disk cannot hold)")
    peak, peak_source = flops.peak_flops(trainer.model_cfg.dtype,
                                          n=self.config.cpu_peak_matmul_size)
    total_peak = flops.peak_total(peak, jax.default_backend(), jax.device_count())
    self.meter = ThroughputMeter(trainer.model_cfg, total_peak, trainer.checkpointer.directory)
    # Said once, the first time a logged MFU is above 100% (then None).
    self.mfu_note = functools.partial(
        flops.mfu_note, peak_source=peak_source, how="--config.cpu_peak_matmul_size, default "
        f"{experiment.base_config().cpu_peak_matmul_size}")
    warning = trainer.checkpointer.space_warning(self.config.keep_checkpoints,
                                                 trainer.setup.state_shapes)
    if warning and main:
      self.progress.write(f"warning: {warning}")
    warning = trainer.eval_cut_warning()
    if warning and main:
      self.progress.write(f"warning: {warning}")
    m, d = trainer.model_cfg, self.config.data
    sizes = " / ".join(f"{len(trainer.data.sources[s]):,} {s}"
                       for s in ("train", "validation", "test") if s in trainer.data.sources)
    self.progress.write(
        f"transformer-jax: {self.origin}; data {d.dataset} {d.source_lang}->{d.target_lang} "
        f"({sizes} pairs); model {m.d_model}d, {m.num_encoder_layers}+"
        f"{m.num_decoder_layers} layers, {m.norm_position}-LN, vocab {m.vocab_size}"
        f"{_options(m)}; mesh {dict(trainer.mesh.shape)}; {jax.process_count()} process(es); "
        f"peak {peak / 1e12:.3f} TFLOP/s per device ({peak_source})")

  def train(self) -> dict:
    last: dict = {}
    try:
      if self.stop_recorded:
        self.progress.write(f"step {self.step}: the run stopped early, after "
                            f"{self.patience.reason()}; nothing to do. {self._train_on()}")
        last["stopped_early"] = self.patience.reason()
      elif self.stopped_early:
        self._stop_here(last)
      elif self.step >= self.config.num_train_steps:
        if not self.finished:
          evaluate, bleu = self._final_evaluation_missing()
          what = "evaluation" if evaluate and bleu else "loss" if evaluate else "BLEU"
          self.progress.write(f"step {self.step}: the final checkpoint has no final {what} "
                              "yet; running it")
          last.update(self._evaluate(evaluate=evaluate, bleu=bleu))
        else:
          self.progress.write(f"step {self.step}: the run is finished (num_train_steps="
                              f"{self.config.num_train_steps}); nothing to do. {self._train_on()}")
      else:
        self._evaluate_if_lost(last)
      with distributed.StopFlag() as stop:
        upcoming = self.batches.next() if self._trains() else None
        while self._trains():
          upcoming, record, stopping = self._one_step(upcoming, stop)
          last = record or last
          if self.stopped_early:
            self._stopped_message(last)
            break
          if stopping is not None:
            self.progress.write(f"{stopping}: saved step {self.step} in "
                                f"{self.trainer.checkpointer.directory}; run the same command "
                                "again to resume")
            last["stopped_by"] = stopping
            break
    except BaseException:
      # An error (a non-finite loss, say) still finishes saves and closes files; an error in
      # closing must not hide the one that stopped the run.
      self._close(quiet=True)
      raise
    self._close()
    if not last or set(last) == {"stopped_early"}:  # nothing trained: a finished run, again
      last = {**metrics_lib.last_values(self.workdir), **last}
    last["step"] = self.step
    return last

  def _trains(self) -> bool:
    """Whether steps are left to train: num_train_steps not reached, not stopped early."""
    return self.step < self.config.num_train_steps and not self.stopped_early

  def _one_step(self, upcoming, stop: distributed.StopFlag):
    """Run the step on `upcoming`, then whatever the cadence asks; returns (the next batch, the
    records logged, the stop signal if the run stops here)."""
    trainer, cadence = self.trainer, self.cadence
    device_batch, (source_lengths, target_lengths) = upcoming
    with trainer.context():
      self.state, step_metrics = trainer.train_step(self.state, device_batch)
    self.step = step = self.step + 1
    # The iterator's position after this step's batch: what a checkpoint of this step saves.
    data_state = self.batches.state()
    # The step runs asynchronously: read batch N+1 and copy it to the devices meanwhile.
    upcoming = self.batches.next() if step < self.config.num_train_steps else None
    self.meter.add(step_metrics, source_lengths, target_lengths)
    logged: dict = {}
    if self.meter.compiling and step == 1:  # a new run's compiling step: logged, not timed
      logged = self._write(step, self.meter.record(step))
    elif self.meter.compiling:
      # A resumed process's: in the averages of the window an uninterrupted run logs it in, so
      # that its train_loss records are the same; left out of the throughput only.
      self.meter.carry(step)
    # Read the flag once: a signal landing between "save?" and "stop?" must not stop unsaved.
    stopping = stop.agreed() if cadence.reads_stop(step, jax.process_count()) else None
    save = cadence.save(step) or stopping is not None
    evaluate, bleu = cadence.evaluate(step), cadence.bleu(step)
    if save or evaluate or bleu or cadence.log(step):
      record = self.meter.record(step)
      if record:
        logged = self._write(step, record)
        self.progress.update(step, record if record.get("tokens_per_sec") else None)
        note = self.mfu_note and self.mfu_note(record.get("mfu", 0.0))
        if note:
          self.progress.write(note)
          self.mfu_note = None
    # Saved before evaluating: an evaluation that fails loses no training, and the
    # asynchronous save writes while the evaluation runs.
    if save:
      self._save(data_state)
    if evaluate or bleu:
      logged = {**logged, **self._evaluate(evaluate, bleu)}
      if (self.patience is not None and not cadence.is_final(step)
          and distributed.from_main(self.patience.exhausted)):
        # Stopped early: this step is the run's last, saved (after its evaluation, which
        # decided it) if the cadence did not, then the record that says so.
        self.stopped_early = True
        if not save:
          self._save(data_state)
        self._write_stop()
    if evaluate or bleu or save:
      self.meter.restart()  # evaluation and saving are not training throughput
    self.progress.update(step)
    return upcoming, logged, stopping

  def _save(self, data_state) -> None:
    """Save this step (with the data iterator's position after it); every process calls it.
    on_cadence: a save forced by a signal or by early stopping falls between the run's evenly
    spaced ones, and the paper's averaging of the last N checkpoints leaves it out
    (run/averaging.py)."""
    meta = {"step": self.step, "origin": self.origin,
            "on_cadence": self.cadence.save(self.step)}
    self.trainer.checkpointer.save(self.step, self.state,
                                   distributed.gather_data_states(data_state), meta, force=True)

  def _write_stop(self) -> None:
    p = self.patience
    self._write(self.step, {early_stopping.RECORD: {
        "metric": p.metric, "patience": p.patience, "min_delta": p.min_delta,
        "evaluations_since_best": p.since_best, "best_step": p.best_step,
        "best_value": p.best_value}})

  def _stop_here(self, last: dict) -> None:
    """Stop early at the resumed step, whose checkpoint is there: the record, the message."""
    self.stopped_early = True
    self._write_stop()
    self._stopped_message(last)

  def _stopped_message(self, last: dict) -> None:
    p, best = self.patience, self.best
    if best is not None and best.step == p.best_step:
      kept = f"the best parameters are in {best.directory}"
    elif (p.min_delta and best is not None and best.step is not None
          and not best_lib.improves(p.best_value, best.value, best.higher)):
      # early_stopping_min_delta: keep_best kept a later step that beat the count's best by
      # less than min_delta
      kept = f"the best parameters, step {best.step}'s, are in {best.directory}"
    else:  # keep_best turned on after the best evaluation (a resume), or a re-run's other best
      kept = (f"step {p.best_step}'s parameters were not kept"
              + (f" ({best.directory} holds step {best.step}'s)" if best is not None and
                 best.step is not None else ""))
    self.progress.write(
        f"step {self.step}: stopped early, after {p.reason()}: step {self.step} is saved in "
        f"{self.trainer.checkpointer.directory}; {kept}. {self._train_on()}")
    last["stopped_early"] = p.reason()

  def _evaluate_if_lost(self, last: dict) -> None:
    """Run the resumed step's evaluation if its cadence asked for one and metrics.jsonl has
    none (the run stopped during it, after the step's save): the learning curve would have a
    gap there, and early stopping's count and keep_best's best would go on without it."""
    step, cadence, main = self.step, self.cadence, distributed.is_main()
    if step == 0:  # a new run (every process has the same step): nothing was lost
      return
    logged = [r for r in metrics_lib.read_metrics(self.workdir)
              if r.get("step") == step] if main else []
    evaluate = distributed.from_main(main and cadence.evaluate(step)
                                     and not any("eval_loss" in r for r in logged))
    bleu = distributed.from_main(main and cadence.bleu(step)
                                 and not any("bleu" in r for r in logged))
    if not (evaluate or bleu):
      return
    self.progress.write(f"step {step}: its evaluation is missing from metrics.jsonl (the run "
                        "stopped during it); running it")
    last.update(self._evaluate(evaluate, bleu))
    if self.patience is not None and distributed.from_main(self.patience.exhausted):
      self._stop_here(last)

  def _close(self, quiet: bool = False) -> None:
    # Each is closed even if one before it fails, and the first failure is raised, unless
    # another error is on its way out (quiet): on a full disk the metrics' close fails too, and
    # must not hide the write that stopped the run. A Ctrl-C while closing (waiting for the
    # last save) still closes the rest, and is raised in any case.
    first = interrupt = None
    for close in (self.trainer.checkpointer.close, self.writer.close, self.progress.close):
      try:
        close()
      except Exception as e:  # noqa: BLE001 - raised below, or behind the one on its way
        first = first or e
      except BaseException as e:  # noqa: BLE001 - a Ctrl-C: raised whatever failed before it
        interrupt = interrupt or e
    if interrupt is not None:
      raise interrupt
    if first is not None and not quiet:
      raise first

  def _write(self, step: int, record: dict) -> dict:
    self.writer.write(step, record)
    return record

  def _evaluate(self, evaluate: bool, bleu: bool) -> dict:
    params = self.state.params
    record = self.trainer.evaluate(params) if evaluate else {}
    if bleu:
      record.update(self.trainer.bleu(params, self.config.bleu_num_sentences))
    self.progress.write(f"step {self.step}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in record.items() if isinstance(v, float)))
    # The best saved before the record: a resume runs again an evaluation metrics.jsonl lacks
    # (`_evaluate_if_lost`), so a save killed or failed (a full disk) is made again; with the
    # record first, the evaluation counted as done and the best was lost for good. Run again,
    # the evaluation ties the best it saved, and a tie saves nothing.
    if self.best is not None and self.best.offer(self.step, params, record):
      self.progress.write(f"step {self.step}: best {self.best.metric} so far; its parameters "
                          f"are in {self.best.directory}")
    self.writer.write(self.step, record)
    if self.patience is not None:
      self.patience.offer(self.step, record)
    return record

  def _train_on(self) -> str:
    """How to train this finished run further: with the run's own config, which a plain
    `--workdir W` resume (no --config) has and --config.<field> overrides need."""
    w = shlex.quote(self.workdir)
    if self.stopped_early:
      resume = shlex.quote("configs/resume.py:" + self.workdir)
      return (f"To train on: python scripts/train.py --config {resume} --workdir {w} "
              f"--config.early_stopping_patience=N (N > {self.patience.patience}; 0: no early "
              "stopping" + (", with --config.early_stopping_min_delta=0" if self.patience.min_delta
                            else "") + ")" + self._smaller_min_delta())
    own = workdir_lib.load_run_config(self.workdir).get("num_train_steps", 0)
    if own > self.step:  # this command's num_train_steps is below the run's own
      return (f"The run's own config ({workdir_lib.current_config_path(self.workdir)}) trains "
              f"to step {own}: python scripts/train.py --workdir {w} resumes with it")
    return (f"To train on: python scripts/train.py --config "
            f"{shlex.quote('configs/resume.py:' + self.workdir)} --workdir {w} "
            f"--config.num_train_steps=N (N > {self.step})")

  def _smaller_min_delta(self) -> str:
    gain = self.patience.gain_since_best
    if not gain:  # no evaluation since the count's best beat it at all
      return ""
    return (f", or --config.early_stopping_min_delta below {gain:.4g} (the largest gain on "
            f"step {self.patience.best_step}'s {self.patience.metric} since, which it would "
            "count as a new best)")

  def _final_evaluation_done(self) -> bool:
    """Whether metrics.jsonl holds the evaluation (loss and BLEU) of this step; decided by the
    process that writes it, so all processes agree on running the (collective) evaluation."""
    done = distributed.is_main() and metrics_lib.evaluated(self.workdir, self.step)
    return distributed.from_main(done)

  def _final_evaluation_missing(self) -> tuple[bool, bool]:
    """(the loss, the BLEU): which of this step's final evaluation metrics.jsonl lacks, so
    that only that runs (a step the cadence evaluated for one of them, made the last by a
    shorter num_train_steps, must not log the other twice); decided as above."""
    missing = (metrics_lib.missing_evaluation(self.workdir, self.step)
               if distributed.is_main() else [])
    return (distributed.from_main("eval_loss" in missing),
            distributed.from_main("bleu" in missing))


def _options(m) -> str:
  """", " and the model's string and bool options that are not TransformerConfig's defaults
  (activation, position_encoding, fused_qkv, ...), so that two variants' logs tell apart."""
  default = TransformerConfig()
  changed = [f"{f.name}={getattr(m, f.name)}" for f in dataclasses.fields(m)
             if f.type in ("str", "bool", str, bool) and f.name not in _NOT_OPTIONS
             and getattr(m, f.name) != getattr(default, f.name)]
  return ", " + ", ".join(changed) if changed else ""


# Shown otherwise (norm_position), or the mode a module runs in rather than the model's.
_NOT_OPTIONS = ("norm_position", "deterministic", "decode")
