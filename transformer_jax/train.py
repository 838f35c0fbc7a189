"""The training loop: `train_and_evaluate(config, workdir)`.

Resumes automatically from `<workdir>/checkpoints` (state, RNG and data iterator position), so a
resumed run sees exactly the batches and losses of an uninterrupted one. SIGTERM/SIGINT finish
the current step, save, and return. A non-finite loss stops the run before anything is saved.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from transformer_jax import bleu as bleu_lib
from transformer_jax import checkpointing, experiment, flops, metrics as metrics_lib, sharding
from transformer_jax.model import Transformer
from transformer_jax.steps import TrainSetup, make_eval_step

log = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
  pass


def maybe_initialize_distributed(config) -> None:
  """Join a multi-process run when asked (explicit coordinator) or when a cluster is detected."""
  if config.distributed == "off" or jax.distributed.is_initialized():
    return
  if config.coordinator_address:
    kwargs = {}
    if config.coordinator_bind_address:
      kwargs["coordinator_bind_address"] = config.coordinator_bind_address
    jax.distributed.initialize(coordinator_address=config.coordinator_address,
                               num_processes=config.num_processes,
                               process_id=config.process_id, **kwargs)
  elif (config.distributed == "on" or int(os.environ.get("SLURM_NTASKS", "1")) > 1
        or "TPU_WORKER_HOSTNAMES" in os.environ or "JAX_COORDINATOR_ADDRESS" in os.environ):
    # JAX finds SLURM, TPU pod (through the metadata server) and Kubernetes settings itself;
    # "on" is for clusters it detects but whose environment we cannot see (gcloud TPU VMs).
    jax.distributed.initialize()


def shutdown_distributed(linger_s: float = 1.0) -> None:
  """Leave a multi-process run with the coordinator's service stopping last.

  `jax.distributed.shutdown` (which JAX also runs at exit) passes a barrier of all clients and
  then stops the coordinator's gRPC service at once. Another process's client may still be
  tearing down and leave a request queued in the service, and gRPC then aborts the coordinator:
  seen once in tests/test_multihost.py ("Check failed: queue.Pop() == nullptr", exit -6 after a
  finished run). Here the coordinator waits `linger_s` between its client's shutdown and its
  service's. The service is not public API; if JAX moves it, this falls back to the plain call.
  """
  if not jax.distributed.is_initialized():
    return
  try:
    from jax._src import distributed as jax_distributed
    state = jax_distributed.global_state
    service = state.service
  except (ImportError, AttributeError):
    jax.distributed.shutdown()
    return
  state.service = None          # so the call below shuts down the client only
  jax.distributed.shutdown()
  if service is not None:
    time.sleep(linger_s)
    service.shutdown()


def gather_data_states(state: dict) -> dict:
  """Every process's data iterator state, so each resumes at its own position in its shard.

  Processes read disjoint shards and their windows fill differently, so their positions drift
  apart; saving only process 0's would put every process at process 0's position on resume.
  """
  count = jax.process_count()
  if count == 1:
    return {"process_count": 1, "processes": {"0": state}}
  blob = np.frombuffer(json.dumps(state).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int32)))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = np.asarray(multihost_utils.process_allgather(padded))
  return {"process_count": count, "processes": {
      str(i): json.loads(bytes(blobs[i, :int(lengths.reshape(-1)[i])]).decode())
      for i in range(count)}}


def own_data_state(saved: dict, data) -> dict | None:
  """This process's iterator state from `gather_data_states`' record (None: nothing saved).

  When the run had another number of processes, the shards differ: `data.resharded_state`
  continues at the same point of the same epoch instead (see `pipeline.resharded_state`).
  """
  if not saved:
    return None
  if "process_count" not in saved and {"parent", "window", "next"} <= set(saved):
    # Written before every process's position was saved (one record, process 0's).
    if jax.process_count() == 1:
      return saved
    log.warning("the checkpoint holds one data position from an older version of this code; "
                "with %d processes each starts its shard from the beginning",
                jax.process_count())
    return None
  count = saved.get("process_count")
  processes = saved.get("processes", {})
  if not isinstance(count, int) or sorted(processes) != sorted(map(str, range(count))):
    raise checkpointing.CheckpointError(
        f"the checkpoint's data iterator record is not one this codebase wrote: {saved!r:.300}. "
        "Resume from another step (move this one aside) or start a new --workdir.")
  if count == jax.process_count():
    return processes[str(jax.process_index())]
  states = [processes[str(i)] for i in range(count)]
  state = data.resharded_state(states)
  log.warning("the checkpoint's data positions are for %d process(es), this run has %d: the "
              "shards differ, so each process continues at the same point of the epoch in its "
              "new shard (chunk %d); the pairs of this epoch come from new permutations, so "
              "some are seen twice and some not until the next epoch", count,
              jax.process_count(), state["parent"]["next_index"])
  return state


def final_evaluation_done(workdir: str, step: int) -> bool:
  """Whether metrics.jsonl holds the evaluation (with BLEU) of `step`; decided by the process
  that writes it, so that all processes agree on running the (collective) evaluation."""
  done = metrics_lib.evaluated(workdir, step) if jax.process_index() == 0 else False
  if jax.process_count() > 1:
    done = bool(multihost_utils.broadcast_one_to_all(np.array(done)))
  return done


def init_from_vocabulary(path: str) -> str | None:
  """The `spm.model` of the run that `init_from` points into (its workdir, its checkpoints
  directory or one step of it), if there is one."""
  path = os.path.abspath(path)
  for candidate in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
    if os.path.exists(os.path.join(candidate, "spm.model")):
      return os.path.join(candidate, "spm.model")
  return None


class _StopFlag:
  """Turns SIGTERM/SIGINT into "save and stop after this step" (preemption loses nothing)."""

  def __init__(self):
    self.signal = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        pass
    return self

  def _handle(self, signum, frame):
    self.signal = signal.Signals(signum).name

  def agreed(self) -> str | None:
    """The signal if any process got one: all processes must save and stop at the same step,
    or the others would wait forever in the next step's collectives."""
    if jax.process_count() == 1:
      return self.signal
    flags = multihost_utils.process_allgather(np.array(self.signal is not None, np.int32))
    return (self.signal or "a signal to another process") if np.any(flags) else None

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _config_json(config, model_cfg) -> dict:
  out = json.loads(config.to_json_best_effort())
  out["resolved_model"] = model_cfg.to_dict()
  return out


def _pad_rows(batch: dict, multiple: int) -> dict:
  """Eval batches: add all-padding rows (segment 0, weight 0) so rows divide the devices."""
  rows = batch["inputs"].shape[0]
  extra = -rows % multiple
  if not extra:
    return batch
  return {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)]) for k, v in batch.items()}


ARRAY_KEYS = ("inputs", "targets", "inputs_segmentation", "targets_segmentation",
              "inputs_position", "targets_position")


class Trainer(TrainSetup):
  """The data, the compiled steps and the checkpointer of one run (see `train_and_evaluate`)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    from transformer_jax.data import get_data  # the data stack is only needed by the loop

    experiment.validate(config)
    maybe_initialize_distributed(config)
    self.config, self.workdir = config, workdir
    self.is_main = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)
    data_config = config.data
    if config.init_from and not data_config.vocab_path:
      # Parameters from another run only mean something with that run's vocabulary.
      vocab = init_from_vocabulary(config.init_from)
      if vocab and not os.path.exists(os.path.join(workdir, "spm.model")):
        data_config = ml_collections.ConfigDict(data_config.to_dict())
        data_config.vocab_path = vocab
    self.data = get_data(data_config, workdir, process_index=jax.process_index(),
                         process_count=jax.process_count())
    tok = self.data.tokenizer
    self.model_cfg = experiment.transformer_config(config, tok.vocab_size, tok.pad_id,
                                                   tok.bos_id, tok.eos_id)
    if self.model_cfg.max_len < max(config.data.max_source_len, config.data.max_target_len):
      raise ValueError(f"config.model.max_len={self.model_cfg.max_len} is shorter than "
                       f"data.max_source_len/max_target_len; raise model.max_len")
    if self.is_main:
      with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(_config_json(config, self.model_cfg), f, indent=2)

    super().__init__(config, self.model_cfg)
    self._check_rows_split_over_devices()
    self.eval_model = Transformer(self.model_cfg.replace(deterministic=True))
    self.abstract_state = checkpointing.abstract_like(self.state_shapes, self.state_shardings)
    self.eval_step = jax.jit(make_eval_step(self.eval_model, config.label_smoothing),
                             in_shardings=(self.state_shardings.params, self.batch_sharding),
                             out_shardings=sharding.replicated(self.mesh))
    self.checkpointer = checkpointing.Checkpointer(
        workdir, max_to_keep=config.keep_checkpoints, keep_period=config.keep_every_steps or None,
        async_save=config.async_checkpointing)

  def _check_rows_split_over_devices(self):
    """Every global batch must split evenly over the batch devices (else a shape error later)."""
    from transformer_jax.data import pipeline
    c, shards = self.config.data, sharding.batch_shards(self.batch_sharding)
    if c.batching == "bucket":
      per_process = pipeline.Batcher(c, self.data.rows_per_process, jax.process_count()).rows
      rows = sorted({r * jax.process_count() for r in per_process})
      fields = "data.batch_tokens or data.bucket_rows_multiple"
    else:
      rows, fields = [self.data.global_rows], "data.batch_size (or data.batch_tokens)"
    bad = [r for r in rows if r % shards]
    if bad:
      raise ValueError(
          f"a global batch of {bad[0]} rows does not split over the {shards} devices of the "
          f"batch axes (mesh {dict(self.mesh.shape)}): change {fields} or config.mesh")

  def initial_state(self):
    """(state, data iterator state or None, how it started): resume > init_from > scratch."""
    restored = self.checkpointer.restore_latest(self.abstract_state)
    if restored is not None:
      step, state, data_state, _ = restored
      return state, data_state, f"resumed from step {step}"
    state = self.init_state(jax.random.key(self.config.seed))
    if self.config.init_from:
      step, params = checkpointing.load_params(self.config.init_from)
      expected = jax.tree.structure(state.params)
      if jax.tree.structure(params) != expected or any(
          a.shape != b.shape for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params))):
        raise ValueError(f"config.init_from={self.config.init_from!r}: its parameters do not "
                         "match this model's shapes; use the same config.model and vocabulary")
      params = jax.tree.map(lambda p, s: jax.device_put(p.astype(s.dtype), s.sharding), params,
                            state.params)
      state = state.replace(params=params)
      return state, None, f"parameters from {self.config.init_from} (step {step})"
    return state, None, "scratch"

  def put(self, batch: dict) -> dict:
    return sharding.global_batch({k: batch[k] for k in ARRAY_KEYS if k in batch},
                                 self.batch_sharding)

  def evaluate(self, params, split: str = "validation") -> dict:
    total = None
    multiple = self.batch_sharding.mesh.size
    for batch in self.data.eval_batches(split):
      arrays = _pad_rows({k: batch[k] for k in ARRAY_KEYS}, multiple)
      rows = arrays["inputs"].shape[0] // jax.process_count()
      lo = jax.process_index() * rows
      local = {k: v[lo:lo + rows] for k, v in arrays.items()}
      with self.context():
        sums = self.eval_step(params, self.put(local))
      total = metrics_lib.accumulate(total, jax.device_get(sums))
    return metrics_lib.summarize(total, "eval")

  def bleu(self, params, num_sentences: int, split: str = "validation") -> dict:
    """sacreBLEU of the configured search on the first `num_sentences` pairs of `split`."""
    from transformer_jax.decode import decode_batch, output_ids  # decoding only for BLEU

    c = self.config
    host_params = multihost_utils.process_allgather(params, tiled=True)  # may span hosts
    tok = self.data.tokenizer
    hyps, refs = [], []
    for batch in self.data.eval_batches(split):
      n = min(batch["num_real"], num_sentences - len(refs))
      if n <= 0:
        break
      # The whole (fixed-shape) batch is decoded so the search compiles once per split.
      tokens, lengths = decode_batch(self.eval_model.config, host_params, batch["inputs"],
                                     beam_size=c.beam_size, alpha=c.length_penalty_alpha,
                                     max_len_margin=c.max_len_margin)
      hyps.extend(tok.decode(ids) for ids in output_ids(tokens, lengths, tok.eos_id)[:n])
      refs.extend(batch["target_text"][:n])
    score, signature = bleu_lib.corpus_bleu(hyps, refs)
    return {"bleu": score, "bleu_signature": signature, "bleu_sentences": len(refs),
            "bleu_example": hyps[0] if hyps else ""}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train (resuming if possible) until `config.num_train_steps`; returns the last metrics."""
  trainer = Trainer(config, workdir)
  c, tok = config, trainer.data.tokenizer
  state, data_state, origin = trainer.initial_state()
  step = int(jax.device_get(state.step))
  train_iter = iter(trainer.data.train_dataset())
  data_state = own_data_state(data_state, trainer.data)
  if data_state:
    train_iter.set_state(data_state)
  # Records past the resumed step (logged before a crash, from steps that are now run again)
  # are dropped, so every step appears once in metrics.jsonl and TensorBoard.
  writer = metrics_lib.MetricsWriter(workdir, enabled=trainer.is_main, resume_step=step)
  progress = metrics_lib.Progress(c.num_train_steps, step, enabled=trainer.is_main)
  peak, peak_source = flops.peak_flops(trainer.model_cfg.dtype)
  num_devices = jax.device_count()
  progress.write(
      f"transformer-jax: {origin}; model {c.model_size} "
      f"({trainer.model_cfg.d_model}d, {trainer.model_cfg.num_encoder_layers}+"
      f"{trainer.model_cfg.num_decoder_layers} layers, vocab {tok.vocab_size}); "
      f"mesh {dict(trainer.mesh.shape)}; {jax.process_count()} process(es); "
      f"peak {peak / 1e12:.3f} TFLOP/s per device ({peak_source})")

  pending, window_flops, window_start = [], 0.0, None
  last: dict = {}
  # On CPU the measured peak is the whole host's (fake devices share its cores).
  peak_total = peak if jax.devices()[0].platform == "cpu" else peak * num_devices

  def flush(now_step: int, timed: bool = True) -> dict:
    """Fetch the pending step metrics, stop on a non-finite loss, log averages.

    `timed=False` for the first step of a process, which includes compilation: its losses are
    logged, its time is not counted as throughput.
    """
    nonlocal pending, window_flops, window_start
    if not pending:
      return {}
    host = jax.device_get(pending)
    total = None
    for m in host:
      # The loss is computed before the update, the norms after it: an update that makes the
      # parameters inf/NaN shows in param_norm before any loss does.
      if not all(np.isfinite(m[k]) for k in ("loss", "grad_norm", "update_norm", "param_norm")):
        raise NonFiniteLossError(
            f"non-finite training loss or parameters at step {now_step}: stopping without saving; the last "
            f"good checkpoint in {trainer.checkpointer.directory} is untouched. Lower "
            "config.learning_rate, raise config.warmup_steps or set config.grad_clip_norm.")
      total = metrics_lib.accumulate(total, {k: m[k] for k in ("loss", "nll", "correct", "tokens",
                                                               "source_tokens")})
    record = metrics_lib.summarize(total, "train")
    record.update({k: float(host[-1][k]) for k in ("learning_rate", "grad_norm", "param_norm",
                                                   "update_norm")})
    elapsed = time.perf_counter() - window_start if timed else 0.0
    if elapsed > 0:
      # Real (non-pad) tokens of the global batch, counted by the step itself.
      record["tokens_per_sec"] = total["tokens"] / elapsed
      record["source_target_tokens_per_sec"] = (total["tokens"] + total["source_tokens"]) / elapsed
      record["steps_per_sec"] = len(host) / elapsed
      record["tflops_per_sec"] = window_flops / elapsed / 1e12
      record["mfu"] = window_flops / elapsed / peak_total
    else:  # a step that includes compilation has no meaningful throughput
      record.update(tokens_per_sec=None, includes_compilation=True)
    pending, window_flops = [], 0.0
    window_start = time.perf_counter()
    return record

  def fetch():
    """The next batch, already on its devices, and its per-sentence lengths (for the FLOPs)."""
    batch = next(train_iter)
    return trainer.put(batch), flops.batch_lengths(batch, tok.pad_id)

  def run_evaluation(params, step: int, evaluate: bool, bleu: bool) -> dict:
    record = trainer.evaluate(params) if evaluate else {}
    if bleu:
      record.update(trainer.bleu(params, c.bleu_num_sentences))
    writer.write(step, record)
    progress.write(f"step {step}: " + ", ".join(
        f"{k} {v:.4f}" for k, v in record.items() if isinstance(v, float)))
    return record

  upcoming = fetch() if step < c.num_train_steps else None
  try:
    if step >= c.num_train_steps and not final_evaluation_done(workdir, step):
      # Resumed from the final checkpoint of a run stopped during its final evaluation.
      progress.write(f"step {step}: the final checkpoint has no final evaluation yet; running it")
      last.update(run_evaluation(state.params, step, True, True))
    with _StopFlag() as stop:
      while step < c.num_train_steps:
        device_batch, (src_lens, tgt_lens) = upcoming
        with trainer.context():
          state, step_metrics = trainer.train_step(state, device_batch)
        step += 1
        # The iterator's position after this step's batch: what a checkpoint of this step saves.
        data_state = train_iter.get_state()
        # The step runs asynchronously: read batch N+1 and copy it to the devices meanwhile.
        upcoming = fetch() if step < c.num_train_steps else None
        pending.append(step_metrics)
        if window_start is None:  # the compiling first step: logged, but not timed
          record = flush(step, timed=False)
          last = record
          writer.write(step, record)
        else:
          # This process's sentences; other processes read equally sized shards.
          window_flops += flops.train_flops(trainer.model_cfg, src_lens, tgt_lens) * jax.process_count()
        final = step == c.num_train_steps
        log_step = step % c.log_every_steps == 0
        # Read the flag once: a signal landing between "save?" and "stop?" must not stop unsaved.
        # With several processes agreeing costs a host round trip, so they agree at log steps.
        stopping = stop.agreed() if (jax.process_count() == 1 or log_step or final) else None
        save = final or step % c.checkpoint_every_steps == 0 or stopping is not None
        evaluate = final or step % c.eval_every_steps == 0
        bleu = final or step % c.bleu_every_steps == 0
        if final or save or evaluate or bleu or log_step:
          record = flush(step)
          if record:
            last = record
            writer.write(step, record)
            progress.update(step, record if record.get("tokens_per_sec") else None)
        # Saved before evaluating: an evaluation that fails loses no training, and the
        # asynchronous save writes while the evaluation runs.
        if save:
          trainer.checkpointer.save(step, state, gather_data_states(data_state),
                                    {"step": step, "origin": origin}, force=True)
        if evaluate or bleu:
          last.update(run_evaluation(state.params, step, evaluate, bleu))
        if evaluate or bleu or save:
          window_start = time.perf_counter()  # evaluation and saving are not training throughput
        progress.update(step)
        if stopping is not None:
          progress.write(f"{stopping}: saved step {step} in {trainer.checkpointer.directory}; "
                         "run the same command again to resume")
          last["stopped_by"] = stopping
          break
  finally:  # an error (a non-finite loss, say) still finishes saves and closes files
    trainer.checkpointer.close()
    writer.close()
    progress.close()
  if not last:  # nothing left to do: a finished run, run again
    last = metrics_lib.last_values(workdir)
  last["step"] = step
  return last

