"""Greedy and beam search: uncached and exhaustive references, EOS, padding, length limits."""
import functools
import inspect
import itertools
import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax import search

VOCAB = 40
MARGIN = 5
# Real source lengths 7, 4, 1 and 0 (an all-padding row): limits differ in one batch.
SOURCE_LENGTHS = np.array([7, 4, 1, 0])


def make_source(vocab, lengths, width, seed=0):
  tokens = np.asarray(jax.random.randint(jax.random.key(seed), (len(lengths), width), 4, vocab))
  return jnp.asarray(np.where(np.arange(width)[None] < np.asarray(lengths)[:, None], tokens, 0))


def expected_limits(lengths, margin, buffer_len):
  """Source length + margin, within the buffer; 0 for an all-padding row (nothing to translate)."""
  lengths = np.asarray(lengths)
  return np.where(lengths > 0, np.minimum(lengths + margin, buffer_len), 0)


@functools.partial(jax.jit, static_argnums=0)
def teacher_forced(model, params, src, targets):
  return model.apply({"params": params}, src, targets)


def reference_logits(model, params, src, targets):
  """Teacher-forced float32 logits `[batch, T, vocab]`, no cache; for a `search.Ensemble`, the
  log of its members' mean probability, member by member in float64."""
  if isinstance(params, search.Ensemble):
    members = [jax.tree.map(lambda x, m=m: x[m], params.stacked) for m in range(params.size)]
    probs = [np.exp(reference_log_probs(model, p, src, targets), dtype=np.float64)
             for p in members]
    return jnp.asarray(np.log(np.mean(probs, axis=0)), jnp.float32)
  return teacher_forced(model, params, src, targets).astype(jnp.float32)


def reference_log_probs(model, params, src, targets):
  """`reference_logits`' log-softmax, numpy."""
  return np.asarray(jax.nn.log_softmax(reference_logits(model, params, src, targets)))


def log_probs_of(cfg, params, src, tokens, lengths):
  """Teacher-forced sum of log-probabilities of `tokens[i, :lengths[i]]`, no cache involved."""
  model = tj.Transformer(cfg.replace(deterministic=True))
  log_probs = reference_log_probs(model, params, src, tokens)
  picked = np.take_along_axis(log_probs, np.asarray(tokens)[..., None], -1)[..., 0]
  return np.where(np.arange(tokens.shape[1])[None] < np.asarray(lengths)[:, None], picked, 0).sum(1)


def uncached_search(cfg, params, src, margin, buffer_len, choose):
  """One token per sentence and step, re-running the whole teacher-forced model on the prefix
  at every step: `choose(logits [batch, vocab], t)` -> tokens `[batch]` (`reference_logits`)."""
  model = tj.Transformer(cfg.replace(deterministic=True))
  limits = expected_limits(np.sum(np.asarray(src) != cfg.pad_id, 1), margin, buffer_len)
  batch = src.shape[0]
  tokens = np.full((batch, buffer_len), cfg.pad_id)
  done = limits <= 0
  for t in range(buffer_len):
    # The model shifts its targets right: logits[:, t] depend on targets[:, :t] only. The dummy
    # tokens from t on must not be padding, which would mask position t's query.
    prefix = np.full((batch, buffer_len), 4)
    prefix[:, :t] = tokens[:, :t]
    logits = reference_logits(model, params, src, jnp.asarray(prefix))[:, t]
    token = np.where(done, cfg.pad_id, choose(logits, t))
    tokens[:, t] = token
    done = done | (token == cfg.eos_id) | (t + 1 >= limits)
  return tokens


def uncached_greedy(cfg, params, src, margin, buffer_len):
  """Greedy search on the uncached model: the most probable token but padding."""
  def choose(logits, t):
    log_probs = np.array(jax.nn.log_softmax(logits))
    log_probs[:, cfg.pad_id] = -np.inf
    return log_probs.argmax(-1)
  return uncached_search(cfg, params, src, margin, buffer_len, choose)


@pytest.fixture(scope="module", autouse=True)
def short_stages():
  """Stages of 4 positions (3 per 12-position buffer here), so that every search in this module
  grows its self-attention cache, and beam search's top-k in blocks of 4 entries, so that it
  takes its two passes (a beam of 4 over the 40 tokens of `tiny` is 40 blocks): the module's
  searches are traced (and compiled) while this is in place, and their results are checked
  against the uncached model and plain-Python references."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(search, "FIRST_STAGE", 4)
    patch.setattr(search, "TOP_K_BLOCK", 4)
    yield


def tie_heavy(rng, shape):
  """Scores with many exact ties (a few distinct values) and some -inf, as a search meets them:
  forbidden tokens, and dead beams whose scores are all -inf."""
  x = rng.integers(0, 6, shape).astype(np.float32)
  return np.where(rng.random(shape) < 0.2, -np.inf, x)


@pytest.mark.parametrize("n,k,block", [(160, 8, 4), (250, 8, 16), (32000, 8, 128), (37, 3, 2),
                                       (64, 8, 4), (10, 2, 4)])
def test_top_k_equals_lax_top_k(n, k, block):
  """Values and indices, ties to the lower index: blocks that divide n or not, the fewest
  blocks that take two passes (2k), and rows too short for them (`lax.top_k` itself)."""
  rng = np.random.default_rng(n + k)
  x = tie_heavy(rng, (6, n))
  x[0] = -np.inf                       # a dead row: its first k indices
  x[1, : n - k] = -np.inf              # the k finite entries are all in the last block(s)
  x[2] = np.arange(n)                  # ascending: the top k are in the last blocks
  expected = jax.lax.top_k(jnp.asarray(x), k)
  got = jax.jit(search.top_k, static_argnums=(1, 2))(jnp.asarray(x), k, block)
  np.testing.assert_array_equal(got[0], expected[0])
  np.testing.assert_array_equal(got[1], expected[1])
  # Two passes from 2k blocks of `block` on (ceil(n / block)), one `lax.top_k` below that.
  passes = str(jax.make_jaxpr(search.top_k, static_argnums=(1, 2))(x, k, block)).count("top_k[")
  assert passes == (2 if -(-n // block) >= 2 * k else 1), passes


def test_this_modules_beam_searches_take_the_two_pass_top_k(tiny):
  # The fixture's blocks of 4 make `tiny`'s 4 x 40 scores 40 blocks, so that the beam searches
  # checked here against references run `top_k`'s two passes, not `lax.top_k` alone: in each
  # stage's loop, two for the candidates, one each for the finished and the live sets.
  cfg, params, src = tiny
  fn = functools.partial(search.beam_search, cfg, beam_size=4, max_len_margin=MARGIN)
  stages = len(search.stage_ends(src.shape[1] + MARGIN))
  assert str(jax.make_jaxpr(fn)(params, src)).count("top_k[") == 4 * stages


def test_first_argmax_equals_argmax():
  rng = np.random.default_rng(0)
  x = tie_heavy(rng, (3, 64, 50))      # over the last axis, whatever the leading ones
  x[0, 0] = -np.inf
  x[0, 1] = np.arange(50)
  x[0, 2, -1] = 9.0                    # the maximum last
  np.testing.assert_array_equal(jax.jit(search.first_argmax)(jnp.asarray(x)), x.argmax(-1))
  # A NaN row has no first maximum: the last index, still a token id.
  assert jax.jit(search.first_argmax)(jnp.array([[[1.0, jnp.nan, 2.0]]])).tolist() == [[2]]


def test_stage_ends():
  assert search.stage_ends(12) == [4, 8, 12]  # with the module's stages of 4
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(search, "FIRST_STAGE", 16)
    assert search.stage_ends(10) == [10]
    assert search.stage_ends(16) == [16]
    assert search.stage_ends(64) == [16, 32, 64]
    assert search.stage_ends(66) == [16, 32, 66]     # 2 positions would be a stage of their own
    assert search.stage_ends(114) == [16, 32, 64, 114]
    assert search.stage_ends(88) == [16, 32, 88]        # 24 more positions: merged
    assert search.stage_ends(96) == [16, 32, 64, 96]    # 32 more: a stage of their own


def while_loop_carries(fn, *args):
  """The shapes each while loop of `fn(*args)` carries, in program order (traced, not run)."""
  loops = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "while":
        loops.append([v.aval.shape for v in eqn.params["body_jaxpr"].jaxpr.invars])
      for param in eqn.params.values():
        if hasattr(param, "jaxpr"):  # pjit's, a closed jaxpr
          walk(getattr(param.jaxpr, "jaxpr", param.jaxpr))
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return loops


@pytest.mark.parametrize("beam", [1, 4])
def test_the_self_attention_cache_grows_stage_by_stage(tiny, beam):
  # A step reads every cached position, so each stage's loop carries a cache of that stage's
  # length only (search.py's stages): the first loop 4 positions, not the buffer's 12.
  cfg, params, src = tiny
  if beam == 1:
    fn = functools.partial(search.greedy_search, cfg, max_len_margin=MARGIN)
  else:
    fn = functools.partial(search.beam_search, cfg, beam_size=beam, max_len_margin=MARGIN)
  loops = while_loop_carries(fn, params, src)
  ends = search.stage_ends(src.shape[1] + MARGIN)
  assert ends == [4, 8, 12] and len(loops) == len(ends)
  layers = cfg.num_decoder_layers
  sources, heads, head_dim = src.shape[0], cfg.num_heads, cfg.d_model // cfg.num_heads
  for end, shapes in zip(ends, loops):
    # Keys and values [rows, heads, positions, kv] of every decoder layer; beam search's values
    # [sources, heads, positions x beams, kv] and keys [sources, heads, kv, positions x beams].
    # Besides them, the cross-attention's [sources, heads, source positions (7), kv].
    cached = sorted(s for s in shapes if len(s) == 4 and s[2] != src.shape[1])
    if beam == 1:
      expected = [(sources, heads, end, head_dim)] * (2 * layers)
    else:
      expected = sorted([(sources, heads, end * beam, head_dim)] * layers
                        + [(sources, heads, head_dim, end * beam)] * layers)
    assert cached == expected, (end, cached)


@pytest.fixture(scope="module")
def tiny():
  cfg = tj.model_config("tiny", vocab_size=VOCAB)
  src = make_source(VOCAB, SOURCE_LENGTHS, 7)
  model = tj.Transformer(cfg.replace(deterministic=True))
  params = model.init(jax.random.key(0), src, src)["params"]
  return cfg, params, src


@pytest.fixture(scope="module")
def greedy(tiny):
  cfg, params, src = tiny
  return search.greedy_search(cfg, params, src, max_len_margin=MARGIN)


@pytest.fixture(scope="module")
def beam4(tiny):
  cfg, params, src = tiny
  return search.beam_search(cfg, params, src, beam_size=4, alpha=0.6, max_len_margin=MARGIN,
                            return_all=True)


@pytest.mark.parametrize("impl", ["xla", "cudnn"])
def test_beam_cache_follows_parents_like_a_reordered_cache(tiny, impl):
  # Beam search's cache leaves keys and values in the slot that wrote them and moves only
  # `cache_rows` when the beams are reordered (layers.py). Against the plain per-row cache whose
  # keys and values are physically reordered by the parents at every step: the same logits at
  # every step, across a stage boundary (stages of 4), for random tokens and random parents, with
  # both attention paths ("cudnn": jax.nn.dot_product_attention, XLA's on a CPU).
  cfg, params, src = tiny
  cfg = cfg.replace(attention_impl=impl)
  sources, beams, steps = 2, 3, 7
  src = src[:sources]
  model = search._decode_model(cfg)
  ends = [4, 8]
  primed_cache = jax.jit(search._primed_cache, static_argnums=(0, 3, 4))
  grouped = primed_cache(model, params, src, ends[0], beams)
  per_row = primed_cache(model, params, jnp.repeat(src, beams, axis=0), ends[0], 1)
  assert "cache_rows" in str(jax.tree_util.tree_structure(grouped))
  rng = np.random.default_rng(0)

  def reorder_keys_and_values(cache, rows):
    def take(path, x):
      moves = getattr(path[-1], "key", None) in ("cached_key", "cached_value")
      return jnp.take(x, rows, axis=0) if moves else x
    return jax.tree_util.tree_map_with_path(take, cache)

  @jax.jit
  def advance(params, grouped, per_row, tokens, rows):
    """A step of both caches (their logits), then each reordered by the parents: compiled
    once per stage, where op by op it took 9 s."""
    got, grouped = search._step_logits(model, params, grouped, tokens)
    want, per_row = search._step_logits(model, params, per_row, tokens)
    return got, want, search._reorder_beams(grouped, rows), reorder_keys_and_values(per_row, rows)

  for step in range(steps):
    if step == ends[0]:
      grouped = search._grow_self_cache(grouped, ends[0], ends[1])
      per_row = search._grow_self_cache(per_row, ends[0], ends[1])
    tokens = jnp.asarray(rng.integers(4, VOCAB, sources * beams), jnp.int32)
    parents = rng.integers(0, beams, (sources, beams))   # some beams die, some fork
    rows = (np.arange(sources)[:, None] * beams + parents).reshape(-1)
    got, want, grouped, per_row = advance(params, grouped, per_row, tokens, jnp.asarray(rows))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")


def check_well_formed(tokens, lengths, limits, eos_id, pad_id=0, scores=None):
  """Output = lengths[i] non-pad tokens, then pad; EOS last, or no EOS and the limit reached.
  Rows whose score is -inf (empty slots of a beam's finished set) are all padding."""
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  filled = np.ones(len(tokens), bool) if scores is None else np.isfinite(np.asarray(scores))
  for row, n, limit, full in zip(tokens, lengths, limits, filled):
    if not full:
      assert (row == pad_id).all()
      continue
    assert n <= limit
    assert (row[:n] != pad_id).all() and (row[n:] == pad_id).all()
    assert eos_id not in row[:max(n - 1, 0)].tolist()
    assert (n > 0 and row[n - 1] == eos_id) or n == limit


def test_greedy_equals_uncached_reference(tiny, greedy):
  cfg, params, src = tiny
  tokens, lengths = greedy
  buffer_len = src.shape[1] + MARGIN
  assert tokens.shape == (4, buffer_len) and tokens.dtype == jnp.int32
  np.testing.assert_array_equal(tokens, uncached_greedy(cfg, params, src, MARGIN, buffer_len))
  check_well_formed(tokens, lengths, expected_limits(SOURCE_LENGTHS, MARGIN, buffer_len),
                    cfg.eos_id)


def test_beam_size_one_equals_greedy(tiny, greedy):
  cfg, params, src = tiny
  tokens, scores = search.beam_search(cfg, params, src, beam_size=1, alpha=0.6,
                                      max_len_margin=MARGIN)
  np.testing.assert_array_equal(tokens, greedy[0])
  lengths = np.asarray(greedy[1])
  expected = log_probs_of(cfg, params, src, greedy[0], lengths) / ((5 + lengths) / 6) ** 0.6
  np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
  # search_batch dispatches to greedy search and hands back numpy.
  np_tokens, np_lengths = search.search_batch(cfg, params, src, beam_size=1, max_len_margin=MARGIN)
  assert isinstance(np_tokens, np.ndarray) and isinstance(np_lengths, np.ndarray)
  np.testing.assert_array_equal(np_tokens, greedy[0])
  np.testing.assert_array_equal(np_lengths, greedy[1])


@pytest.mark.parametrize("beam,parts", [(1, 2), (1, 4), (4, 2)])
def test_a_batch_searched_in_parts_is_the_batch_searched_whole(tiny, beam, parts):
  """`search_batch` with `parts`: slices of the rows searched at the same time give every row
  what the whole batch's search gives it, bit for bit and in row order (the rows differ: source
  lengths 7, 4, 1 and 0)."""
  cfg, params, src = tiny
  whole = search.search_batch(cfg, params, src, beam_size=beam, max_len_margin=MARGIN, parts=1)
  split = search.search_batch(cfg, params, src, beam_size=beam, max_len_margin=MARGIN,
                              parts=parts)
  assert len(set(map(tuple, whole[0]))) == 4
  for a, b in zip(whole, split):
    assert b.dtype == np.int32
    np.testing.assert_array_equal(b, a)
  with pytest.raises(ValueError, match="parts=3: must be >= 1 and divide the batch's 4 rows"):
    search.search_batch(cfg, params, src, beam_size=beam, max_len_margin=MARGIN, parts=3)


def test_in_parts_runs_the_slices_at_the_same_time_and_joins_them_in_order():
  # Each call waits for the other two at the barrier: run one after another, they would fail.
  barrier, seen = threading.Barrier(3, timeout=20), []
  def fake(rows, other):
    seen.append((threading.get_ident(), rows.shape[0], int(rows[0])))
    barrier.wait()
    return rows * 2, other + 1
  doubled, plus_one = search.in_parts(fake, np.arange(6), np.arange(6) * 10, parts=3)
  np.testing.assert_array_equal(doubled, np.arange(6) * 2)
  np.testing.assert_array_equal(plus_one, np.arange(6) * 10 + 1)
  assert sorted(s[1:] for s in seen) == [(2, 0), (2, 2), (2, 4)]
  assert len({s[0] for s in seen}) == 3
  # One part: the caller's thread, the whole rows.
  seen.clear()
  search.in_parts(lambda rows: (seen.append(threading.get_ident()) or rows,), np.arange(3),
                  parts=1)
  assert seen == [threading.get_ident()]
  with pytest.raises(ValueError, match="parts=0"):
    search.in_parts(fake, np.arange(6), np.arange(6), parts=0)
  with pytest.raises(ValueError, match=r"hold \[6, 4\] rows: each must hold the batch's 6"):
    search.in_parts(fake, np.arange(6), np.zeros((4, 3)), parts=2)
  # One pool of threads for each number of parts, kept: not threads made at every batch.
  assert search._threads(3) is search._threads(3)


def test_concurrent_parts_halves_even_batches_on_one_cpu_device_of_two_cores(monkeypatch):
  # The tests' 8 fake devices: a batch stays whole.
  assert search.concurrent_parts(16) == 1
  monkeypatch.setattr(search.jax, "local_device_count", lambda: 1)
  monkeypatch.setattr(search, "_cores", lambda: 2)
  assert [search.concurrent_parts(rows) for rows in (1, 2, 15, 16, 64)] == [1, 2, 1, 2, 2]
  monkeypatch.setattr(search, "_cores", lambda: 1)
  assert search.concurrent_parts(16) == 1
  monkeypatch.setattr(search, "_cores", lambda: 16)
  assert search.concurrent_parts(16) == 2
  monkeypatch.setattr(search.jax, "default_backend", lambda: "gpu")
  assert search.concurrent_parts(16) == 1


def test_the_cores_are_the_affinitys_within_a_cgroup_quota(tmp_path, monkeypatch):
  # Not on Linux: os.cpu_count (which may not know: None).
  monkeypatch.delattr(search.os, "sched_getaffinity", raising=False)
  monkeypatch.setattr(search, "CPU_MAX", str(tmp_path / "none"))
  monkeypatch.setattr(search, "CFS_FILES", (str(tmp_path / "none"),) * 2)
  for count, cores in ((3, 3), (None, 1)):
    monkeypatch.setattr(search.os, "cpu_count", lambda count=count: count)
    assert search._cores() == cores
  # This process's affinity (pid 0).
  monkeypatch.setattr(search.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3} if pid == 0
                      else set(), raising=False)
  v2, quota, period = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
  monkeypatch.setattr(search, "CPU_MAX", str(v2))
  monkeypatch.setattr(search, "CFS_FILES", (str(quota), str(period)))
  assert search._cores() == 4                    # no cgroup files: the affinity
  for text, cores in (("max 100000\n", 4), ("150000 100000\n", 1), ("200000 100000\n", 2),
                      ("900000 100000\n", 4), ("50000 100000\n", 1), ("1 100000\n", 1),
                      ("2 1\n", 2), ("0 100000\n", 4), ("100000 0\n", 4), ("garbled\n", 4)):
    v2.write_text(text)
    assert search._cores() == cores, text
  v2.unlink()
  quota.write_text("-1\n")                       # cgroup v1: no quota
  period.write_text("100000\n")
  assert search._cores() == 4
  quota.write_text("100000\n")
  assert search._cores() == 1


def test_in_parts_searches_whole_under_settings_of_this_thread_alone():
  """A `with` block's JAX or Flax settings hold in this thread only: a batch searched in parts
  would have the other threads' parts searched without them."""
  def threads_used():
    seen = set()
    search.in_parts(lambda rows: (seen.add(threading.get_ident()) or rows,), np.arange(4),
                    parts=2)
    return len(seen)
  assert threads_used() == 2 and search._thread_settings() == []
  # Made one at a time: jax.set_mesh sets its mesh when called, before its `with`.
  for block, name in ((lambda: jax.debug_nans(True), "jax_debug_nans"),
                      (lambda: jax.default_matmul_precision("highest"),
                       "jax_default_matmul_precision"),
                      (lambda: jax.set_mesh(jax.make_mesh((1,), ("data",))), "mesh"),
                      (lambda: nn.logical_axis_rules([("batch", "data")]), "logical_axis_rules")):
    with block():
      assert search._thread_settings() == [name]
      assert threads_used() == 1, name


def test_beam_scores_match_teacher_forcing(tiny, beam4):
  """The search's scores are those of its sequences under the uncached model: the self-attention
  cache followed every beam's reordering."""
  cfg, params, src = tiny
  seqs, scores = (np.asarray(x) for x in beam4)
  batch, beam, buffer_len = seqs.shape
  assert (batch, beam) == (4, 4)
  # Finished set best first (filled slots, then empty ones at -inf); the last row (all padding)
  # has only the empty output, with log-probability 0.
  for row in scores:
    filled = int(np.isfinite(row).sum())
    assert np.isfinite(row[:filled]).all() and (np.diff(row[:filled]) <= 0).all()
  assert np.isfinite(scores[:, 0]).all()
  assert scores[3, 0] == 0.0 and not np.isfinite(scores[3, 1:]).any()
  limits = expected_limits(SOURCE_LENGTHS, MARGIN, buffer_len)
  flat = seqs.reshape(batch * beam, buffer_len)
  lengths = (flat != cfg.pad_id).sum(1)
  for k in range(beam):
    check_well_formed(seqs[:, k], lengths.reshape(batch, beam)[:, k], limits, cfg.eos_id,
                      scores=scores[:, k])
  finite = np.isfinite(scores.reshape(-1))
  expected = log_probs_of(cfg, params, jnp.repeat(src, beam, 0), jnp.asarray(flat), lengths)
  expected = expected / ((5 + lengths) / 6) ** 0.6
  np.testing.assert_allclose(scores.reshape(-1)[finite], expected[finite], rtol=1e-5, atol=1e-5)
  # search_batch (best hypothesis only) agrees with the full finished set.
  np_tokens, np_lengths = search.search_batch(cfg, params, src, beam_size=4, alpha=0.6,
                                              max_len_margin=MARGIN)
  np.testing.assert_array_equal(np_tokens, seqs[:, 0])
  np.testing.assert_array_equal(np_lengths, (seqs[:, 0] != cfg.pad_id).sum(1))
  # ... and so with beam 2: every beam_size but 1 is beam search, not greedy search.
  two, _ = search.beam_search(cfg, params, src, beam_size=2, max_len_margin=MARGIN)
  np.testing.assert_array_equal(search.search_batch(cfg, params, src, beam_size=2,
                                                    max_len_margin=MARGIN)[0], two)
  assert not np.array_equal(two, search.greedy_search(cfg, params, src, max_len_margin=MARGIN)[0])


def test_target_log_probs_are_what_the_searches_score(tiny, beam4, greedy):
  """`search.target_log_probs` (scripts/score.py) gives the numpy reference's
  teacher-forced log-probabilities, beam search's finished scores times their length penalty,
  greedy search's outputs theirs (and greedy search's `score=True` the same), 0 for an
  all-padding row, and each row alone what it gives in the batch."""
  cfg, params, src = tiny
  seqs, scores = (np.asarray(x) for x in beam4)
  batch, beam, buffer_len = seqs.shape
  flat = seqs.reshape(batch * beam, buffer_len)
  lengths = (flat != cfg.pad_id).sum(1)
  sources = jnp.repeat(src, beam, 0)
  got = np.asarray(search.target_log_probs(cfg, params, sources, jnp.asarray(flat)))
  assert got.shape == (batch * beam,) and got.dtype == np.float32
  np.testing.assert_allclose(got, log_probs_of(cfg, params, sources, jnp.asarray(flat), lengths),
                             rtol=1e-6, atol=1e-6)
  finite = np.isfinite(scores.reshape(-1))
  np.testing.assert_allclose(got[finite], (scores.reshape(-1) * ((5 + lengths) / 6) ** 0.6)[finite],
                             rtol=1e-5, atol=1e-5)
  assert (got[~finite] == 0).all() and (got[(batch - 1) * beam:] == 0).all()  # padding rows
  one = np.asarray(search.target_log_probs(cfg, params, sources[1:2], jnp.asarray(flat[1:2])))
  np.testing.assert_allclose(one, got[1:2], rtol=1e-6, atol=1e-6)
  tokens, lengths = (np.asarray(x) for x in greedy)
  teacher = np.asarray(search.target_log_probs(cfg, params, src, jnp.asarray(tokens)))
  np.testing.assert_allclose(teacher, log_probs_of(cfg, params, src, jnp.asarray(tokens), lengths),
                             rtol=1e-6, atol=1e-6)
  # Greedy search scoring in its own loop (greedy n-best): the same tokens, the same numbers.
  scored = search.greedy_search(cfg, params, src, max_len_margin=MARGIN, score=True)
  np.testing.assert_array_equal(scored[0], tokens)
  np.testing.assert_array_equal(scored[1], lengths)
  np.testing.assert_allclose(scored[2], teacher, rtol=1e-5, atol=1e-5)
  assert scored[2][-1] == 0 and (scored[2][:-1] < 0).all()


def sample_keys(n, seed=0):
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(seed), jnp.arange(n))


def test_sampling_scores_its_samples_and_top_1_is_greedy(tiny, greedy):
  """Sampling among the single most probable token is greedy search, token for token; every
  sample's log-probability is the teacher-forced one of its tokens; a sentence's sample is the
  same alone as in the batch (its own key); the all-padding row produces nothing."""
  cfg, params, src = tiny
  keys = sample_keys(src.shape[0])
  tokens, lengths, log_probs = search.sample_search(cfg, params, src, keys, top_k=1,
                                                    max_len_margin=MARGIN)
  np.testing.assert_array_equal(tokens, greedy[0])
  np.testing.assert_array_equal(lengths, greedy[1])
  np.testing.assert_allclose(log_probs, search.target_log_probs(cfg, params, src, tokens),
                             rtol=1e-5, atol=1e-5)
  # So is the nucleus of a tiny probability (the best token alone), at any temperature.
  tokens, lengths, _ = search.sample_search(cfg, params, src, keys, temperature=1.5,
                                            top_p=1e-6, max_len_margin=MARGIN)
  np.testing.assert_array_equal(tokens, greedy[0])
  np.testing.assert_array_equal(lengths, greedy[1])
  tokens, lengths, log_probs = search.sample_search(cfg, params, src, keys, temperature=1.5,
                                                    max_len_margin=MARGIN)
  tokens = np.asarray(tokens)
  assert not np.array_equal(tokens, greedy[0])
  check_well_formed(tokens, lengths, expected_limits(SOURCE_LENGTHS, MARGIN, tokens.shape[1]),
                    cfg.eos_id)
  np.testing.assert_allclose(log_probs, search.target_log_probs(cfg, params, src, tokens),
                             rtol=1e-5, atol=1e-5)
  assert lengths[3] == 0 and log_probs[3] == 0
  alone = search.sample_search(cfg, params, src[1:2], keys[1:2], temperature=1.5,
                               max_len_margin=MARGIN)[0]
  np.testing.assert_array_equal(np.asarray(alone)[0], tokens[1])


def nucleus_mask(values, top_p):
  """For logits sorted best first, which are in the nucleus (Holtzman et al., 2020): the fewest
  best whose probabilities reach `top_p`, counted in float64 one token at a time."""
  probs = np.exp(values - values.max()) / np.exp(values - values.max()).sum()
  keep, mass = np.zeros(len(values), bool), 0.0
  for i, p in enumerate(probs):
    if mass >= top_p:
      break
    keep[i], mass = True, mass + p
  return keep


def uncached_sample(cfg, params, src, keys, temperature, top_k, margin, buffer_len, top_p=1.0):
  """Sampling as documented, one sentence and step at a time on the uncached model: the token
  of sentence b at step t is `jax.random.categorical(fold_in(keys[b], t), logits / T)` (over
  the top k's values, mapped back to their ids, with top_k; over all the values sorted, the
  ones outside the nucleus at -inf, with top_p < 1), padding excluded."""
  def choose(logits, t):
    logits = logits.at[:, cfg.pad_id].set(-jnp.inf) / temperature
    tokens = []
    for b in range(logits.shape[0]):
      key = jax.random.fold_in(keys[b], t)
      if top_k or top_p < 1.0:
        values, index = jax.lax.top_k(logits[b], top_k or logits.shape[-1])
        if top_p < 1.0:
          values = jnp.where(nucleus_mask(np.asarray(values, np.float64), top_p), values,
                             -jnp.inf)
        tokens.append(int(index[jax.random.categorical(key, values)]))
      else:
        tokens.append(int(jax.random.categorical(key, logits[b])))
    return np.array(tokens)
  return uncached_search(cfg, params, src, margin, buffer_len, choose)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.5, 0, 1.0), (0.5, 3, 1.0),
                                                     (1.5, 0, 0.6), (1.0, 4, 0.8)])
def test_sampling_draws_step_by_step_as_documented(tiny, temperature, top_k, top_p):
  """Against the uncached reference: the key of every step (fold_in of the sentence's key and
  the step), the temperature, the top-k and the nucleus restrictions, through the cache."""
  cfg, params, src = tiny
  keys = sample_keys(src.shape[0], seed=2)
  tokens = search.sample_search(cfg, params, src, keys, temperature=temperature, top_k=top_k,
                                top_p=top_p, max_len_margin=MARGIN)[0]
  expected = uncached_sample(cfg, params, src, keys, temperature, top_k, MARGIN, tokens.shape[1],
                             top_p)
  np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("top_p,kept", [(0.45, 1), (0.5, 1), (0.75, 2), (0.81, 3),
                                        (0.96, 4), (0.999, 4)])
def test_the_nucleus_is_the_fewest_best_tokens_reaching_p(top_p, kept):
  """Probabilities 0.5, 0.3, 0.15, 0.05 and padding (-inf) behind, as sorted logits: a nucleus
  of 0.5 is the best token alone (it reaches 0.5), of 0.75 the best two, of 0.81 three; the
  padding's zero probability is never in one. A row of ties keeps the fewest that reach p, not
  every token tied with the last one kept."""
  row = np.log(np.array([0.5, 0.3, 0.15, 0.05, 0.0], np.float32))
  out = np.asarray(search.nucleus(jnp.asarray(np.stack([row, row + 7.0])), top_p))
  expected = np.where(np.arange(5) < kept, row, -np.inf)
  np.testing.assert_array_equal(out, np.stack([expected, expected + 7.0]))
  ties = np.asarray(search.nucleus(jnp.zeros((1, 8)), top_p))[0]
  assert (ties[:int(np.ceil(top_p * 8 - 1e-6))] == 0).all()
  assert np.isneginf(ties).sum() == 8 - int(np.ceil(top_p * 8 - 1e-6))
  for top_p in (0.0, 1.5):
    with pytest.raises(ValueError, match=f"top_p={top_p}: must be above 0 and at most 1"):
      search.sample_search(None, None, None, None, top_p=top_p)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.0, 0, 0.7)])
def test_samples_follow_the_models_distribution(tiny, temperature, top_k, top_p):
  """The first token of 8,000 samples of one source: its frequencies are softmax(logits /
  temperature) over the vocabulary without padding, restricted to the top k or to the nucleus
  (renormalised), to within 4.5 standard deviations of a proportion."""
  cfg, params, src = tiny
  n = 8000
  sources = jnp.repeat(src[:1], n, 0)
  tokens = search.sample_search(cfg, params, sources, sample_keys(n, seed=1),
                                temperature=temperature, top_k=top_k, top_p=top_p,
                                max_decode_len=1)[0]
  counts = np.bincount(np.asarray(tokens)[:, 0], minlength=VOCAB) / n
  model = tj.Transformer(cfg.replace(deterministic=True))
  logits = np.array(teacher_forced(model, params, src[:1], jnp.full((1, 1), 4)))[0, 0]
  logits[cfg.pad_id] = -np.inf
  if top_k:
    logits[logits < np.sort(logits)[-top_k]] = -np.inf
  if top_p < 1.0:
    order = np.argsort(-logits / temperature, kind="stable")
    outside = order[~nucleus_mask(logits[order] / temperature, top_p)]
    assert 1 < len(order) - len(outside) < VOCAB - 1  # a nucleus that restricts, of several
    logits[outside] = -np.inf
  expected = np.asarray(jax.nn.softmax(jnp.asarray(logits / temperature)))
  assert counts[cfg.pad_id] == 0 and (counts[expected == 0] == 0).all()
  np.testing.assert_allclose(counts, expected, atol=4.5 * np.sqrt(0.25 / n))


def test_eos_ends_sentences_and_pads_after(tiny, greedy):
  """Declaring greedy's first token of sentence 0 the EOS (the model never reads eos_id) makes that
  sentence end at once and every other one end at that token's first occurrence."""
  cfg, params, src = tiny
  tokens, _ = (np.asarray(x) for x in greedy)
  eos = int(tokens[0, 0])
  assert eos not in (cfg.pad_id, cfg.bos_id)
  ecfg = cfg.replace(eos_id=eos)
  new_tokens, new_lengths = (np.asarray(x) for x in
                             search.greedy_search(ecfg, params, src, max_len_margin=MARGIN))
  assert new_lengths[0] == 1 and new_tokens[0, 0] == eos and (new_tokens[0, 1:] == 0).all()
  limits = expected_limits(SOURCE_LENGTHS, MARGIN, tokens.shape[1])
  for row, new_row, n, limit in zip(tokens, new_tokens, new_lengths, limits):
    hits = np.flatnonzero(row[:limit] == eos)
    assert n == (hits[0] + 1 if hits.size else limit)
    np.testing.assert_array_equal(new_row[:n], row[:n])
  check_well_formed(new_tokens, new_lengths, limits, eos)
  # Beam search: outputs are well formed; sentence 0's best is either the immediate EOS or longer.
  seqs, scores = search.beam_search(ecfg, params, src, beam_size=4, alpha=0.6,
                                    max_len_margin=MARGIN, return_all=True)
  seqs, scores = np.asarray(seqs), np.asarray(scores)
  for k in range(4):
    check_well_formed(seqs[:, k], (seqs[:, k] != 0).sum(1), limits, eos, scores=scores[:, k])
  assert [eos] in [list(s[s != 0]) for s in seqs[0]]  # the one-token hypothesis was finished


@pytest.mark.parametrize("margin", [0, 2])
def test_length_limits(tiny, greedy, margin):
  cfg, params, src = tiny
  buffer_len = src.shape[1] + margin
  limits = expected_limits(SOURCE_LENGTHS, margin, buffer_len)
  tokens, lengths = search.greedy_search(cfg, params, src, max_len_margin=margin)
  assert tokens.shape == (4, buffer_len)
  check_well_formed(tokens, lengths, limits, cfg.eos_id)
  # A shorter limit truncates the same greedy output.
  full = np.asarray(greedy[0])
  for i, n in enumerate(np.asarray(lengths)):
    np.testing.assert_array_equal(np.asarray(tokens)[i, :n], full[i, :n])
  # The all-padding row has no room, whatever the margin (filler rows of a bucketed batch
  # must not keep the loop running); beam search keeps to the same limits.
  assert lengths[3] == 0 and (np.asarray(tokens)[3] == cfg.pad_id).all()
  seqs, scores = search.beam_search(cfg, params, src, beam_size=3, max_len_margin=margin)
  check_well_formed(seqs, (np.asarray(seqs) != 0).sum(1), limits, cfg.eos_id)
  assert scores[3] == 0.0 and (np.asarray(seqs)[3] == cfg.pad_id).all()


def test_buffer_caps(tiny, greedy):
  cfg, params, src = tiny
  # An explicit buffer shorter than source + margin caps every sentence.
  tokens, lengths = search.greedy_search(cfg, params, src, max_len_margin=MARGIN, max_decode_len=3)
  assert tokens.shape == (4, 3)
  np.testing.assert_array_equal(tokens, np.asarray(greedy[0])[:, :3])
  # So does the model's longest position: the decoder has no position beyond it.
  assert search.buffer_length(cfg.replace(max_len=8), 7, MARGIN) == 8
  assert search.buffer_length(cfg, 7, MARGIN) == 12
  assert search.buffer_length(cfg, 7, MARGIN, max_decode_len=100) == cfg.max_len
  assert search.buffer_length(cfg, 7, MARGIN, max_decode_len=1) == 1   # one token: room enough
  assert search.buffer_length(cfg, 0, 1) == 1
  # Each sentence's limit: real source tokens + margin, within the buffer; 0 for all-padding.
  np.testing.assert_array_equal(search.length_limits(cfg, src, MARGIN, 9),
                                expected_limits(SOURCE_LENGTHS, MARGIN, 9))
  for beam_size in (0, -1):
    with pytest.raises(ValueError, match=f"beam_size={beam_size}"):
      search.search_batch(cfg, params, src, beam_size=beam_size)
  with pytest.raises(ValueError, match="no room to decode"):
    search.greedy_search(cfg, params, src, max_decode_len=0)


def test_output_ids_strips_eos_and_padding():
  tokens = np.array([[5, 6, 3, 0], [5, 6, 7, 8], [3, 0, 0, 0], [0, 0, 0, 0]])
  assert search.output_ids(tokens, [3, 4, 1, 0], eos_id=3) == [[5, 6], [5, 6, 7, 8], [], []]


# --- Exhaustive search on a tiny vocabulary ---------------------------------------------------

SMALL_VOCAB = 6        # pad 0, 1, bos 2, eos 3, 4, 5: five tokens may be produced
SMALL_MARGIN = 2       # sources of 2 and 1 real tokens: limits 4 and 3
WIDE_BEAM = 80         # >= 16 live prefixes x 5 tokens: the most candidates of a step before the
                       # limit, so no EOS candidate is ever ranked out (see beam_search)


def small_vocab_model(seed, kernel_scale=1.0, eos_bias=0.0):
  """(config, params, sources) of a tiny model on SMALL_VOCAB, its output layer's kernel scaled
  and its EOS logit raised."""
  cfg = tj.model_config("tiny", vocab_size=SMALL_VOCAB, tie_output_embedding=False)
  src = jnp.array([[4, 5], [5, 0]])
  model = tj.Transformer(cfg.replace(deterministic=True))
  params = nn.meta.unbox(model.init(jax.random.key(seed), src, src)["params"])
  dense = params["decoder"]["logits_dense"]
  params["decoder"]["logits_dense"] = {**dense, "kernel": dense["kernel"] * kernel_scale,
                                       "bias": dense["bias"].at[cfg.eos_id].add(eos_bias)}
  return cfg, params, src


@pytest.fixture(scope="module")
def peaked():
  # Larger logits: peakier distributions that depend on the prefix. Not too peaked, or greedy
  # search finds the best output (it does at 4x here): at 2x it does not for the second sentence.
  return small_vocab_model(1, kernel_scale=2.0)


def all_outputs(cfg, limit):
  """Every output up to `limit` tokens: EOS-terminated, or `limit` tokens without EOS."""
  allowed = [v for v in range(cfg.output_vocab_size) if v not in (cfg.pad_id, cfg.eos_id)]
  outputs = [list(p) + [cfg.eos_id]
             for n in range(limit) for p in itertools.product(allowed, repeat=n)]
  return outputs + [list(p) for p in itertools.product(allowed, repeat=limit)]


# alpha 0.6 is the paper's; at 2 the penalty favours long outputs so strongly that a short
# finished hypothesis must not stop the search while a live one can still beat it: rule (a)'s
# bound (the best live log-probability over the largest penalty it can reach) decides there.
@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_wide_beam_equals_exhaustive_search(peaked, alpha):
  cfg, params, src = peaked
  limits = [4, 3]
  seqs, scores = search.beam_search(cfg, params, src, beam_size=WIDE_BEAM, alpha=alpha,
                                    max_len_margin=SMALL_MARGIN)
  greedy_tokens, _ = search.greedy_search(cfg, params, src, max_len_margin=SMALL_MARGIN)
  # Score every output of both sentences in one teacher-forced batch, as beam search scores them:
  # sum of log-probabilities / ((5 + length) / 6) ** alpha.
  outputs = [all_outputs(cfg, limit) for limit in limits]
  sentence = np.concatenate([np.full(len(o), i) for i, o in enumerate(outputs)])
  flat = [out for o in outputs for out in o]
  tokens = np.zeros((len(flat), max(limits)), np.int32)
  for i, out in enumerate(flat):
    tokens[i, :len(out)] = out
  lengths = np.array([len(o) for o in flat])
  exhaustive = log_probs_of(cfg, params, src[sentence], jnp.asarray(tokens), lengths)
  exhaustive = exhaustive / ((5 + lengths) / 6) ** alpha
  differs = []
  for i in range(len(limits)):
    best = int(np.argmax(np.where(sentence == i, exhaustive, -np.inf)))
    row = np.asarray(seqs[i])
    assert row[:lengths[best]].tolist() == flat[best] and (row[lengths[best]:] == 0).all()
    np.testing.assert_allclose(scores[i], exhaustive[best], rtol=1e-5, atol=1e-5)
    differs.append(np.asarray(greedy_tokens[i]).tolist() != row.tolist())
  if alpha == 0.6:  # at 2, greedy's long outputs happen to be the best here
    assert any(differs), "greedy already finds the best output: the test would not test search"
  # At alpha 0.6 the best output is not greedy's, yet beam size 1 still is greedy search (EOS
  # candidates ranked below the beam are not finished: see beam_search).
  one, _ = search.beam_search(cfg, params, src, beam_size=1, alpha=alpha,
                              max_len_margin=SMALL_MARGIN)
  np.testing.assert_array_equal(one, greedy_tokens)


REFERENCE_ROWS, REFERENCE_POSITIONS = WIDE_BEAM, 8   # the widest beam, the longest buffer here


def reference_beam_search(cfg, params, source, beam, alpha, margin, buffer_len,
                          early_stopping=True):
  """beam_search's documented rules, one sentence, in plain Python on teacher-forced
  log-probabilities (no cache): the finished set, best first, as [(score, tokens)]. Without
  `early_stopping`, rules (a) and (b) are off: the search goes on to the length limit."""
  model = tj.Transformer(cfg.replace(deterministic=True))
  limit = min(int((np.asarray(source) != cfg.pad_id).sum()) + margin, buffer_len)
  penalty = lambda n: ((5.0 + n) / 6.0) ** alpha  # noqa: E731
  live, finished = [((), 0.0)], []    # live: best first, as top_k leaves it
  # The prefixes are scored in a batch of REFERENCE_ROWS x REFERENCE_POSITIONS (at least), rows
  # and positions beyond `beam` and `buffer_len` filler: one shape, so one compiled reference
  # per model and source length rather than one per beam and buffer.
  rows, positions = max(beam, REFERENCE_ROWS), max(buffer_len, REFERENCE_POSITIONS)
  for i in range(limit):
    prefixes = np.full((rows, positions), 4)           # positions >= i: any non-padding token
    for j, (seq, _) in enumerate(live):
      prefixes[j, :i] = seq
    log_probs = np.array(reference_log_probs(model, params, jnp.repeat(source[None], rows, 0),
                                             jnp.asarray(prefixes))[:beam, i], np.float64)
    log_probs[:, cfg.pad_id] = -np.inf
    vocab = log_probs.shape[1]
    # The 2 * beam best one-token extensions (ties: the lower flat index, as lax.top_k).
    extensions = sorted(((logp + log_probs[j, v], j * vocab + v, seq + (v,))
                         for j, (seq, logp) in enumerate(live) for v in range(vocab)
                         if np.isfinite(log_probs[j, v])), key=lambda c: (-c[0], c[1]))
    extensions = extensions[:min(2 * beam, beam * vocab)]
    ends = [c[2][-1] == cfg.eos_id or i + 1 >= limit for c in extensions]
    new = [(logp / penalty(i + 1), seq) for rank, ((logp, _, seq), end)
           in enumerate(zip(extensions, ends)) if end and rank < beam]
    finished = sorted(finished + new, key=lambda f: -f[0])[:beam]   # stable: old ones first
    live = [(seq, logp) for (logp, _, seq), end in zip(extensions, ends) if not end][:beam]
    if not live:                                                                    # (c)
      break
    if not early_stopping:
      continue
    if len(finished) == beam and finished[-1][0] >= live[0][1] / penalty(i + 1):    # (b)
      break
    reachable = live[0][1] / max(penalty(i + 2), penalty(limit))
    if finished and finished[0][0] >= reachable:                                    # (a)
      break
  return [(score, list(seq)) for score, seq in finished]


# Beams from narrow to wider than a step's candidates (then some of the 2 * beam candidates are
# -inf, and must neither finish nor count as finished), outputs of 1 to 6 tokens, both alphas.
@pytest.mark.parametrize("beam,margin,alpha",
                         [(3, 0, 0.6), (3, 2, 0.6), (10, 4, 2.0), (80, 4, 2.0)])
def test_beam_search_follows_its_rules_step_by_step(peaked, beam, margin, alpha):
  assert_finished_sets_follow_the_rules(peaked, beam, margin, alpha)


def assert_finished_sets_follow_the_rules(model, beam, margin, alpha):
  """beam_search's whole finished set of each sentence equals reference_beam_search's: not only
  the best, since which hypotheses stay live (an EOS among the candidates must not take a live
  slot) shows in the runners-up long before in the best."""
  cfg, params, src = model
  seqs, scores = search.beam_search(cfg, params, src, beam_size=beam, alpha=alpha,
                                    max_len_margin=margin, return_all=True)
  for i in range(src.shape[0]):
    finished = reference_beam_search(cfg, params, src[i], beam, alpha, margin, seqs.shape[2])
    assert len(finished) >= 1, i
    for k in range(beam):
      row = np.asarray(seqs[i, k])
      if k >= len(finished):  # an empty slot
        assert scores[i, k] == -np.inf and (row == 0).all(), (i, k)
        continue
      score, tokens = finished[k]
      assert row[:len(tokens)].tolist() == tokens and (row[len(tokens):] == 0).all(), (i, k)
      np.testing.assert_allclose(scores[i, k], score, rtol=1e-5, atol=1e-5)


# On this source the peaked model's best output at alpha 0 finishes after two worse ones; beam 2
# under fairseq's rule (stop once `beam` have finished) returned the runner-up, -2.03 against
# -1.82.
@pytest.mark.parametrize("beam", [2, 3])
def test_early_stopping_never_drops_a_better_live_hypothesis_at_alpha_zero(peaked, beam):
  # With alpha 0 a hypothesis's score can only fall as it grows: stopping early must return the
  # same best hypothesis as searching on to the length limit, and stopping by rule (b) (a full
  # finished set no worse than the best live score) the same whole set.
  cfg, params, _ = peaked
  src = jnp.array([[5, 5, 5]])
  seqs, scores = search.beam_search(cfg, params, src, beam_size=beam, alpha=0.0,
                                    max_len_margin=4, return_all=True)
  finished = reference_beam_search(cfg, params, src[0], beam, 0.0, 4, seqs.shape[2],
                                   early_stopping=False)
  best_score, best_tokens = finished[0]
  row = np.asarray(seqs[0, 0])
  assert row[:len(best_tokens)].tolist() == best_tokens and (row[len(best_tokens):] == 0).all()
  np.testing.assert_allclose(scores[0, 0], best_score, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(scores[0], [f[0] for f in finished], rtol=1e-5, atol=1e-5)


def test_the_stopping_rules_on_given_scores():
  # beam_search's rules (a)-(c) on given scores; finished sets of 2 (best first);
  # lp(n) = ((5 + n) / 6) ** alpha, 1 at alpha 0.
  inf = -np.inf
  cases = [  # (finished, best live, length, longest reachable, alpha, stops)
      # (b) judges the best live score as it is: -1.9 is worse than -1.1 (a live hypothesis may
      # still finish between them), though not worse than -1.1 // 1 = -2.
      ([-1.2, -1.9], -1.1, 3, 10, 0.0, False),
      ([-1.2, -1.9], -1.95, 3, 10, 0.0, True),    # (b), and (a)
      ([-1.2, inf], -1.15, 3, 10, 0.0, False),    # not full: (b) cannot hold
      ([-1.2, inf], -1.3, 3, 10, 0.0, True),      # (a)
      ([-1.2, -1.9], inf, 3, 10, 0.0, True),      # (c): no live hypothesis left
      ([inf, inf], inf, 3, 10, 0.0, True),        # (c), with nothing finished
      ([-1.25, inf], -1.25, 3, 10, 0.0, True),    # (a) on a tie
      ([-0.75, -1.0], -1.0, 1, 7, 1.0, True),     # (b) alone on a tie: lp(1) = 1, lp(7) = 2
      # With alpha 0.6, (b) divides the live score by the penalty of its length now ...
      ([-0.5, -0.6], -0.7, 3, 10, 0.6, False),    # -0.7 / lp(3) = -0.589 > -0.6
      ([-0.5, -0.6], -0.8, 3, 10, 0.6, True),     # -0.8 / lp(3) = -0.673: (b) alone
      # ... and (a) by the largest it may still reach: the limit's for alpha >= 0, ...
      ([-0.3, inf], -0.45, 3, 10, 0.6, False),    # -0.45 / lp(10) = -0.260 > -0.3
      ([-0.3, inf], -0.39, 3, 4, 0.6, True),      # -0.39 / lp(4) = -0.306 (/ lp(5): -0.287)
      # ... the next length's below 0 (lp falls as outputs grow).
      ([-0.37, inf], -0.3, 3, 10, -0.6, True),    # -0.3 / lp(4) = -0.383 (/ lp(3): -0.357)
      ([-0.39, inf], -0.3, 3, 10, -0.6, False),   # (/ lp(5): -0.408, / lp(10): -0.520)
  ]
  for finished, live, length, limit, alpha, expected in cases:
    got = search.stops(jnp.array([finished], jnp.float32), jnp.array([live], jnp.float32),
                       length, search.length_penalty(jnp.array([limit]), alpha), alpha)
    assert bool(got[0]) == expected, (finished, live, length, limit, alpha)


def test_an_eos_candidate_does_not_take_a_live_slot():
  # Each step keeps `beam` live hypotheses even when some of the best candidates end in EOS:
  # the 2 * beam candidates hold at least `beam` that go on (at most one EOS per parent). On
  # this EOS-prone model (its EOS logit raised) EOS candidates rank within the beam; a search
  # that let them take live slots (`beam` candidates per step) keeps the same best output here
  # but finishes fewer hypotheses, which the step-by-step rules catch.
  assert_finished_sets_follow_the_rules(small_vocab_model(2, eos_bias=2.0), 2, 4, 0.6)


def test_defaults_are_the_papers_decoding_settings():
  # Section 6.1: beam 4, length penalty alpha 0.6, at most input length + 50 output tokens.
  for fn, beam in ((search.greedy_search, None), (search.beam_search, 4),
                   (search.search_batch, 1), (search.sample_search, None)):
    params = inspect.signature(fn).parameters
    assert params["max_len_margin"].default == 50, fn
    if beam is not None:
      assert params["beam_size"].default == beam and params["alpha"].default == 0.6, fn


@pytest.fixture(scope="module")
def ensemble(tiny):
  """`tiny`'s model and another initialisation of it, decoded together."""
  cfg, params, src = tiny
  model = tj.Transformer(cfg.replace(deterministic=True))
  return search.Ensemble.of([params, model.init(jax.random.key(1), src, src)["params"]])


def test_ensemble_greedy_search_follows_the_mean_probability(tiny, ensemble, greedy):
  """An ensemble's greedy search picks, step by step, the most probable token under its members'
  mean probability (the uncached reference, member by member in float64), scores its outputs
  by it (and `target_log_probs` too); two copies of one model decode as that model."""
  cfg, params, src = tiny
  tokens, lengths, scores = search.greedy_search(cfg, ensemble, src, max_len_margin=MARGIN,
                                                 score=True)
  np.testing.assert_array_equal(tokens, uncached_greedy(cfg, ensemble, src, MARGIN,
                                                        tokens.shape[1]))
  assert not np.array_equal(tokens, greedy[0]), "the ensemble decodes as its first member"
  expected = log_probs_of(cfg, ensemble, src, tokens, lengths)
  np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(search.target_log_probs(cfg, ensemble, src, tokens), expected,
                             rtol=1e-5, atol=1e-5)
  twice = search.greedy_search(cfg, search.Ensemble.of([params, params]), src,
                               max_len_margin=MARGIN)
  np.testing.assert_array_equal(twice[0], greedy[0])
  # Sampling among the top 1 of the mean probability is the ensemble's greedy search.
  sampled = search.sample_search(cfg, ensemble, src, sample_keys(src.shape[0]), top_k=1,
                                 max_len_margin=MARGIN)
  np.testing.assert_array_equal(sampled[0], tokens)
  np.testing.assert_allclose(sampled[2], scores, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="2 or more models"):
    search.Ensemble.of([params])


def test_ensemble_beam_search_follows_its_rules_step_by_step(peaked):
  """Beam search on two models' mean probability: the whole finished set as the plain-Python
  rules give it (each beam's parent followed in both members' caches, which grow by stages:
  a margin of 4 makes a 6-position buffer, stages of 4 and 6)."""
  cfg, params, src = peaked
  other = small_vocab_model(3, kernel_scale=2.0)[1]
  assert search.stage_ends(src.shape[1] + 4) == [4, 6]
  assert_finished_sets_follow_the_rules((cfg, search.Ensemble.of([params, other]), src), 3, 4,
                                        0.6)


def test_an_ensemble_of_host_arrays_is_stacked_on_the_host():
  """The Translator's members come from checkpoints as host numpy arrays: stacked there, the
  device holds one copy of each once put there (not the members and the stack)."""
  host = {"w": np.ones((2, 3), np.float32)}
  stacked = search.Ensemble.of([host, host, host])
  assert type(stacked.stacked["w"]) is np.ndarray and stacked.size == 3
  device = {"w": jnp.ones((2, 3))}
  assert isinstance(search.Ensemble.of([device, device]).stacked["w"], jax.Array)
