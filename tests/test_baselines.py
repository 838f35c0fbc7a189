"""The Flax `examples/wmt` rebuilds that the speed targets are measured against
(`transformer_jax/bench/flax_wmt*.py`, `scripts/baseline_flax_wmt.py`) compute what the example
computes: a comparison with a broken baseline would say nothing. Tiny sizes (the module's
constants, patched)."""
import json
from pathlib import Path
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.bench import flax_wmt, flax_wmt_search
from transformer_jax.bench import train as bench_train
from transformer_jax.sweeps import spec

from scripts_under_test import load_script

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

ROWS, SOURCE_LEN, DECODE_LEN = 3, 7, 6


def reference_config():
  """configs/cpu_reference.py's config: our side of the speed comparison."""
  return spec.load_config_module(str(CONFIGS / "cpu_reference.py")).get_config()


@pytest.fixture
def tiny(monkeypatch):
  for name, value in dict(V=37, D=16, H=2, F=32, N=2, B=2, L=8).items():
    monkeypatch.setattr(flax_wmt, name, value)
  params = flax_wmt_search.init_params(ROWS, SOURCE_LEN, DECODE_LEN, seed=6)
  inputs = jnp.asarray(np.random.default_rng(1).integers(1, 37, (ROWS, SOURCE_LEN)), jnp.int32)
  inputs = inputs.at[1, 4:].set(0)  # a padded source
  cache = flax_wmt_search.init_cache(ROWS, SOURCE_LEN, DECODE_LEN)
  return params, inputs, cache


def randomized(params, seed=3):
  """Every parameter random (LayerNorm scales and biases included), so that none is a no-op."""
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [jnp.asarray(rng.normal(0.0, 0.5, x.shape), x.dtype)
                                   for x in leaves])


def reference_logits(params, inputs, targets):
  """The example's model at evaluation (teacher forcing), written again in NumPy float64 from
  google/flax examples/wmt/models.py: unscaled embeddings plus its sinusoid table (sines, then
  cosines; the frequency step log(10000) / (d/2 - 1)), pre-LN blocks (LayerNorm eps 1e-6), attention
  without biases whose masked logits are float32's lowest, ReLU MLP, final LayerNorms, targets
  shifted right by one 0, logits through the shared embedding divided by sqrt(d_model)."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  inputs, targets = np.asarray(inputs), np.asarray(targets)
  embedding = p["embed"]["embedding"]
  d = embedding.shape[1]

  def position(n):
    angle = np.arange(n)[:, None] * np.exp(np.arange(d // 2) * -np.log(1e4) / (d // 2 - 1))
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)

  def norm(x, q):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * q["scale"] + q["bias"]

  def attend(x, memory, mask, q):  # mask [batch, queries, keys]
    query = np.einsum("btd,dhk->bhtk", x, q["query"]["kernel"])
    key = np.einsum("bsd,dhk->bhsk", memory, q["key"]["kernel"])
    value = np.einsum("bsd,dhk->bhsk", memory, q["value"]["kernel"])
    logits = np.einsum("bhtk,bhsk->bhts", query, key) / np.sqrt(query.shape[-1])
    logits = np.where(mask[:, None], logits, np.finfo(np.float32).min)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhts,bhsk,hkd->btd", weights, value, q["out"]["kernel"])

  def mlp(x, q):
    hidden = np.maximum(x @ q["Dense_0"]["kernel"] + q["Dense_0"]["bias"], 0.0)
    return hidden @ q["Dense_1"]["kernel"] + q["Dense_1"]["bias"]

  source, target = inputs > 0, targets > 0
  x = embedding[inputs] + position(inputs.shape[1])
  for n in range(sum(name.startswith("encoder_blocks") for name in p)):
    q = p[f"encoder_blocks_{n}"]
    x = x + attend(norm(x, q["LayerNorm_0"]), norm(x, q["LayerNorm_0"]),
                   source[:, :, None] & source[:, None], q["MultiHeadDotProductAttention_0"])
    x = x + mlp(norm(x, q["LayerNorm_1"]), q["Mlp_0"])
  encoded = norm(x, p["encoder_norm"])
  causal = np.tril(np.ones((targets.shape[1],) * 2, bool))
  y = embedding[np.pad(targets, ((0, 0), (1, 0)))[:, :-1]] + position(targets.shape[1])
  for n in range(sum(name.startswith("decoder_blocks") for name in p)):
    q = p[f"decoder_blocks_{n}"]
    self_mask = target[:, :, None] & target[:, None] & causal
    y = y + attend(norm(y, q["LayerNorm_0"]), norm(y, q["LayerNorm_0"]), self_mask,
                   q["MultiHeadDotProductAttention_0"])
    y = y + attend(norm(y, q["LayerNorm_1"]), encoded, target[:, :, None] & source[:, None],
                   q["MultiHeadDotProductAttention_1"])
    y = y + mlp(norm(y, q["LayerNorm_2"]), q["Mlp_0"])
  return norm(y, p["decoder_norm"]) @ embedding.T / np.sqrt(d)


def test_model_is_the_examples_model(tiny):
  """The rebuild against the example's equations in NumPy: every parameter used where the
  example uses it, both padding masks, the causal mask and the shift."""
  params, inputs, _ = tiny
  params = randomized(params)
  targets = np.random.default_rng(2).integers(1, 37, (ROWS, DECODE_LEN))
  targets[0, 4:] = 0  # a padded target: its positions are not compared (their rows see nothing)
  targets[2, 1] = 1  # id 1, the smallest that is not padding, on both sides
  inputs = inputs.at[0, 2].set(1)
  logits = np.asarray(flax_wmt.Model(train=False).apply({"params": params}, inputs,
                                                        jnp.asarray(targets, jnp.int32)))
  want = reference_logits(params, inputs, targets)
  assert logits.shape == want.shape == (ROWS, DECODE_LEN, 37)
  real = targets > 0
  np.testing.assert_allclose(logits[real], want[real], rtol=2e-4, atol=2e-4)
  # The same numbers with the source's padding cut off: padding is masked, not attended to.
  cut = flax_wmt.Model(train=False).apply({"params": params}, inputs[1:2, :4],
                                          jnp.asarray(targets[1:2], jnp.int32))
  np.testing.assert_allclose(np.asarray(cut)[0], logits[1], rtol=1e-5, atol=1e-5)


def test_position_table_is_the_examples():
  """examples/wmt/models.py's `sinusoidal_init`, float64 here: sines of position x
  10000 ** (-k / (d/2 - 1)) in the first half of the features, cosines in the second."""
  d = 16
  angle = np.arange(50)[:, None] * 10000.0 ** (-np.arange(d // 2) / (d // 2 - 1))
  want = np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)[None]
  np.testing.assert_allclose(np.asarray(flax_wmt.sinusoid(50, d)), want, rtol=0, atol=2e-6)


def test_optimizer_is_adam_with_the_papers_betas():
  """Two Adam steps by hand (lr 1e-3, b1 0.9, b2 0.98, eps 1e-9, as configs' adam_* fields)."""
  c = reference_config()
  assert (c.adam_b1, c.adam_b2, c.adam_eps) == (0.9, 0.98, 1e-9)
  tx = flax_wmt.optimizer()
  params = jnp.zeros(3)
  state = tx.init(params)
  grads = [np.array([0.5, -2.0, 1e-12]), np.array([-1.0, 3.0, 4.0])]
  m, v = np.zeros(3), np.zeros(3)
  for t, g in enumerate(grads, 1):
    update, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
    m, v = 0.9 * m + 0.1 * g, 0.98 * v + 0.02 * g * g
    want = -1e-3 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.98 ** t)) + 1e-9)
    np.testing.assert_allclose(np.asarray(update), want, rtol=1e-5, atol=1e-12)


def test_dropout_only_in_training(tiny):
  params, inputs, _ = tiny
  targets = jnp.asarray(np.random.default_rng(2).integers(1, 37, (ROWS, DECODE_LEN)), jnp.int32)

  def logits(train, key):
    return np.asarray(flax_wmt.Model(train=train).apply(
        {"params": params}, inputs, targets, rngs={"dropout": jax.random.key(key)}))
  np.testing.assert_array_equal(logits(False, 0), logits(False, 1))
  assert not np.allclose(logits(True, 0), logits(True, 1))
  default = [flax_wmt.Model().apply({"params": params}, inputs, targets,
                                    rngs={"dropout": jax.random.key(key)}) for key in (0, 1)]
  assert not np.allclose(*default)  # `run`'s model, `Model()`, trains with dropout
  assert not np.allclose(logits(True, 0), logits(False, 0))


def test_attention_dropout_is_drawn_per_row(tiny, monkeypatch):
  """The example's attention dropout (`broadcast_dropout=False`): two identical rows get
  different masks (the other dropout off here, so that only attention's shows)."""
  params, inputs, _ = tiny
  monkeypatch.setattr(flax_wmt, "DROP", 0.0)
  targets = jnp.asarray(np.random.default_rng(2).integers(1, 37, (1, DECODE_LEN)), jnp.int32)
  pair = flax_wmt.Model(train=True).apply(
      {"params": params}, jnp.repeat(inputs[:1], 2, axis=0), jnp.repeat(targets, 2, axis=0),
      rngs={"dropout": jax.random.key(0)})
  assert not np.allclose(pair[0], pair[1])
  monkeypatch.setattr(flax_wmt, "ADROP", 0.0)
  pair = flax_wmt.Model(train=True).apply(
      {"params": params}, jnp.repeat(inputs[:1], 2, axis=0), jnp.repeat(targets, 2, axis=0),
      rngs={"dropout": jax.random.key(0)})
  np.testing.assert_array_equal(pair[0], pair[1])  # no dropout left: the rows agree


def test_loss_is_the_examples_label_smoothed_cross_entropy(tiny):
  """examples/wmt/train.py's `compute_weighted_cross_entropy` (smoothing 0.1) over the weighted
  tokens: the KL divergence from the smoothed one-hot, so 0 at the smoothed target itself."""
  rng = np.random.default_rng(4)
  targets = rng.integers(1, 37, (2, 5))
  weights = np.ones((2, 5), np.float32)
  weights[1, 3:] = 0.0
  soft = np.full((2, 5, 37), 0.1 / 36)
  np.put_along_axis(soft, targets[..., None], 0.9, axis=-1)
  assert float(flax_wmt.loss_fn(jnp.log(jnp.asarray(soft, jnp.float32)), jnp.asarray(targets),
                                jnp.asarray(weights))) == pytest.approx(0.0, abs=1e-5)
  logits = rng.normal(0.0, 2.0, (2, 5, 37))
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  kl = (soft * (np.log(soft) - log_p)).sum(-1)
  got = flax_wmt.loss_fn(jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
                         jnp.asarray(weights))
  assert float(got) == pytest.approx((kl * weights).sum() / weights.sum(), rel=1e-5)


def test_run_trains_and_reports_the_median_step(tiny, monkeypatch):
  """`run` (the train baseline) takes Adam steps on its fixed batch: its loss falls; the figures
  are the median of the timed steps (a stand-in clock); and it refuses 0 steps."""
  def clock():  # each run's timed step j takes (4j + 1) / 1e5 s: the median known
    ticks = iter(np.arange(100.0) ** 2 / 1e5)
    return types.SimpleNamespace(perf_counter=lambda: next(ticks))
  monkeypatch.setattr(flax_wmt, "time", clock())
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
  first = flax_wmt.run(steps=1)
  monkeypatch.setattr(flax_wmt, "time", clock())
  monkeypatch.delenv("GLIBC_TUNABLES")
  later = flax_wmt.run(steps=25)
  # How its host memory was paged (it runs with glibc's defaults unless told otherwise).
  assert (first["glibc_tunables"], later["glibc_tunables"]) == ("glibc.malloc.hugetlb=1", "")
  assert np.isfinite(first["loss"]) and later["loss"] < first["loss"] - 0.5  # 3.41 -> 2.46
  assert first["median_step_s"] == 0.0 and later["median_step_s"] == 0.0005  # 4 decimals
  assert later["target_tokens_per_sec"] == round(2 * 8 / 0.00049, 1)
  # The warm-up steps (as many as the train benchmark's) before the timed ones, none timed.
  assert flax_wmt.WARMUP_STEPS == bench_train.TrainOptions().warmup
  calls = []
  step = flax_wmt.train_step
  monkeypatch.setattr(flax_wmt, "train_step", lambda *a: (
      lambda *b: calls.append(len(calls)) or step(*a)(*b)))
  monkeypatch.setattr(flax_wmt, "time", clock())
  flax_wmt.run(steps=2)
  assert len(calls) == flax_wmt.WARMUP_STEPS + 2
  with pytest.raises(ValueError, match="steps=0"):
    flax_wmt.run(steps=0)


def test_sizes_are_the_cpu_reference_setting():
  """The baseline measures the shapes our side of the comparison does (configs/cpu_reference.py):
  vocabulary, d_model, heads, d_ff, layers, rows, tokens per row."""
  c = reference_config()
  m = c.model
  assert m.num_encoder_layers == m.num_decoder_layers
  assert (flax_wmt.V, flax_wmt.D, flax_wmt.H, flax_wmt.F, flax_wmt.N, flax_wmt.B, flax_wmt.L) == (
      c.data.vocab_size, m.d_model, m.num_heads, m.d_ff, m.num_encoder_layers, c.data.batch_size,
      c.data.max_target_len)
  assert c.data.max_source_len == flax_wmt.L and (flax_wmt.DROP, flax_wmt.ADROP) == (
      m.dropout_rate, m.attention_dropout_rate) and c.label_smoothing == 0.1


def test_train_batch_has_no_padding_and_the_step_updates_in_place(tiny):
  inputs, targets = flax_wmt.batch(np.random.default_rng(0))
  for ids in (inputs, targets):  # 16 x 37 draws: a 0 (padding) would show
    assert ids.shape == (2, 8) and int(ids.min()) >= 1 and int(ids.max()) < 37
  model, tx = flax_wmt.Model(), flax_wmt.optax.adam(1e-3)
  params = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)},
                      inputs, targets)["params"]
  opt_state = tx.init(params)
  leaves = jax.tree.leaves((params, opt_state))
  key = jax.random.key(2)
  # The loss is over the tokens that are not padding (a padded batch here, unlike `batch`'s):
  # the loss of the parameters before the update, with the step's dropout.
  padded = targets.at[1, 5:].set(0).at[0, 0].set(1)  # and id 1, the lowest that counts
  logits = model.apply({"params": params}, inputs, padded, rngs={"dropout": key})
  want = float(flax_wmt.loss_fn(logits, padded, (padded > 0).astype(jnp.float32)))
  assert want != pytest.approx(float(flax_wmt.loss_fn(logits, padded, jnp.ones((2, 8)))), rel=1e-3)
  new_params, _, loss = flax_wmt.train_step(model, tx)(params, opt_state, key, inputs, padded)
  assert float(loss) == pytest.approx(want, rel=1e-5) and not key.is_deleted()
  assert all(x.is_deleted() for x in leaves)  # donated, as the example's state
  assert jax.tree.structure(new_params) == jax.tree.structure(params)


def test_script_runs_the_default_steps(monkeypatch, capsys):
  """`baseline_flax_wmt.py` without a count runs `DEFAULT_STEPS`, the number its usage gives."""
  script = load_script("baseline_flax_wmt")
  assert f"default {flax_wmt.DEFAULT_STEPS} steps" in script.__doc__
  asked = []
  monkeypatch.setattr(flax_wmt, "run", lambda steps: asked.append(steps) or {"steps": steps})
  assert script.main([]) == 0 and script.main(["7"]) == 0 and asked == [flax_wmt.DEFAULT_STEPS, 7]
  assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
      {"steps": flax_wmt.DEFAULT_STEPS}, {"steps": 7}]


def teacher_forced_argmax(params, inputs, tokens):
  """The example's model without a cache: each position's argmax given the tokens before it."""
  logits = flax_wmt.Model(train=False).apply({"params": params}, inputs, tokens)
  return np.asarray(jnp.argmax(logits, axis=-1))


def test_cached_greedy_equals_the_uncached_model(tiny):
  params, inputs, cache = tiny
  tokens = np.asarray(flax_wmt_search.greedy(params, inputs, cache, decode_len=DECODE_LEN))
  # The example's model may emit 0, its padding id, which teacher forcing would read as
  # padding: seed 6 is one where it does not (and the tokens vary).
  assert tokens.shape == (ROWS, DECODE_LEN) and (tokens > 0).all() and len(np.unique(tokens)) > 2
  # Greedy means: every token is the argmax given the ones before it (cache, positions and the
  # cross-attention padding mask all agree with the plain model).
  np.testing.assert_array_equal(teacher_forced_argmax(params, inputs, tokens), tokens)
  # And each cached step's logits are the plain model's at that position (positions counted
  # from 0 in the cache as in the table).
  step = flax_wmt_search._step_fn(params, flax_wmt_search._encode(params, inputs), inputs)
  plain = flax_wmt.Model(train=False).apply({"params": params}, inputs, jnp.asarray(tokens))
  last = jnp.zeros((ROWS, 1), jnp.int32)
  for i in range(DECODE_LEN):
    logits, cache = step(last, cache)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(plain[:, i]), rtol=1e-4, atol=1e-4)
    last = jnp.asarray(tokens[:, i:i + 1])


def test_beam_search_best_is_the_best_scoring_of_its_set(tiny):
  params, inputs, cache = tiny
  seqs, scores = flax_wmt_search.beam_search(params, inputs, cache, beam=3, decode_len=DECODE_LEN)
  seqs, scores = np.asarray(seqs), np.asarray(scores)
  assert seqs.shape == (ROWS, 3, DECODE_LEN + 1) and (seqs[:, :, 0] == 0).all()
  assert (seqs[:, :, 1:] > 0).all()  # no padding id emitted (see the greedy test)
  # No EOS: the live set is returned, best last, each score its sequence's log-probability
  # (computed again here without the cache).
  assert (np.diff(scores, axis=1) >= 0).all()
  model = flax_wmt.Model(train=False)
  for b in range(3):
    logits = model.apply({"params": params}, inputs, jnp.asarray(seqs[:, b, 1:]))
    log_probs = jax.nn.log_softmax(logits)
    chosen = np.take_along_axis(np.asarray(log_probs), seqs[:, b, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(chosen.sum(-1), scores[:, b], rtol=1e-4, atol=1e-4)
  # Beam 1 is greedy search.
  one, _ = flax_wmt_search.beam_search(params, inputs, cache, beam=1, decode_len=DECODE_LEN)
  greedy = flax_wmt_search.greedy(params, inputs, cache, decode_len=DECODE_LEN)
  np.testing.assert_array_equal(np.asarray(one)[:, -1, 1:], np.asarray(greedy))


def test_baseline_script_decode_prints_each_search(tiny, capsys):
  script = load_script("baseline_flax_wmt")
  assert script.main(["--what", "decode", "--beams", "1,2", "--steps", "1", "--rows", "2",
                      "--source_len", "5", "--decode_len", "4"]) == 0
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert result["rows"] == 2 and result["decode_len"] == 4
  for name in ("greedy", "beam 2"):
    assert result[name]["batch_time_s"] > 0 and result[name]["sentences_per_s"] > 0
  assert script.main(["--what", "decode", "--beams", "1,0"]) == 2


def log_prob_sums(params, inputs, seqs):
  """Each row's summed log-probabilities of its tokens `seqs` [rows, T] (0 after the end:
  padding, which is not counted), from the model without a cache."""
  seqs = np.asarray(seqs)
  logits = flax_wmt.Model(train=False).apply({"params": params}, inputs, jnp.asarray(seqs))
  chosen = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), seqs[..., None], -1)[..., 0]
  return np.where(seqs > 0, chosen, 0.0).sum(-1)


def test_greedy_stops_each_row_at_eos(tiny):
  params, inputs, cache = tiny
  plain = np.asarray(flax_wmt_search.greedy(params, inputs, cache, decode_len=DECODE_LEN))
  assert plain[2, 1] == 5 and 5 not in plain[:2]  # seed 6: only row 2 emits 5, at step 2
  ended = np.asarray(flax_wmt_search.greedy(params, inputs, cache, decode_len=DECODE_LEN,
                                            eos_id=5))
  want = plain.copy()
  want[2, 2:] = 0  # 0 after EOS; the other rows as without it
  np.testing.assert_array_equal(ended, want)


def test_greedy_makes_decode_len_tokens(tiny):
  """A shorter `decode_len` gives the first tokens of a longer one, and no more steps: a fourth
  step would overwrite the third token. Random parameters whose tokens change at step 4; the
  benchmark's EOS is an id no model produces."""
  params, inputs, cache = tiny
  params = randomized(params, seed=5)
  six = np.asarray(flax_wmt_search.greedy(params, inputs, cache, decode_len=6))
  assert (six[:, 3] != six[:, 2]).any()
  three = flax_wmt_search.greedy(params, inputs, cache, decode_len=3)
  np.testing.assert_array_equal(three, six[:, :3])
  assert flax_wmt_search.NO_EOS < 0


def test_beam_search_with_eos_keeps_the_best_finished(tiny):
  """With an EOS the example's search returns, per sentence that finished any hypothesis, its
  finished set (score: log-probability over GNMT's length penalty ((5 + length) / 6) ** alpha,
  a slot never filled at -1e7), best last; a sentence that finished none, its live set."""
  params, inputs, cache = tiny
  for eos, lengths in ((3, [None, [None, 2, 1], [None, 2, 1]]), (20, [[5, 4, 3], None, None])):
    seqs, scores = flax_wmt_search.beam_search(params, inputs, cache, beam=3,
                                               decode_len=DECODE_LEN, eos_id=eos)
    seqs, scores = np.asarray(seqs), np.asarray(scores)
    assert (np.diff(scores, axis=1) >= 0).all()
    for b in range(ROWS):
      if lengths[b] is None:  # nothing finished: the live set, no EOS, unpenalized
        assert eos not in seqs[b] and (seqs[b, :, 1:] > 0).all()
        np.testing.assert_allclose(log_prob_sums(params, jnp.repeat(inputs[b:b + 1], 3, axis=0),
                                                 seqs[b, :, 1:]),
                                   scores[b], rtol=1e-4, atol=1e-4)
        continue
      for k, length in enumerate(lengths[b]):
        if length is None:
          assert scores[b, k] == flax_wmt_search.NEG_INF and not seqs[b, k].any()
          continue
        tokens = seqs[b, k, 1:]
        assert tokens[length - 1] == eos and (tokens[:length - 1] != eos).all()
        assert not tokens[length:].any()
        log_p = log_prob_sums(params, inputs[b:b + 1], tokens[None])[0]
        assert scores[b, k] == pytest.approx(log_p / ((5 + length) / 6) ** 0.6, abs=1e-4)


def reference_beam_search(params, inputs, *, beam, decode_len, eos, alpha=0.6):
  """google/flax examples/wmt/decode.py's `beam_search`, one sentence at a time in plain Python,
  each step's log-probabilities from the model without a cache: the 2 * beam best extensions of
  the live set (ties to the lower index, as `lax.top_k`), the best `beam` of them that did not
  end live, the best `beam` of the old finished set and those that ended (scored over GNMT's
  length penalty) finished; until no live hypothesis can beat the worst finished one or the
  length is reached. Returns sequences (start token 0 first) and scores, best last."""
  neg, length = flax_wmt_search.NEG_INF, decode_len + 1
  penalty = lambda n: ((5.0 + n) / 6.0) ** alpha  # noqa: E731
  top = lambda x, k: np.argsort(-np.asarray(x), kind="stable")[:k]  # noqa: E731
  model = flax_wmt.Model(train=False)
  out_seqs, out_scores = [], []
  for b in range(inputs.shape[0]):
    live = [([0], 0.0 if k == 0 else neg) for k in range(beam)]
    finished = [([0] * length, neg, False)] * beam
    for i in range(length - 1):
      worst = min(score for _, score, _ in finished)
      if all(flag for *_, flag in finished) and worst > live[-1][1] / penalty(length):
        break
      targets = np.zeros((beam, decode_len), np.int32)
      for k, (seq, _) in enumerate(live):
        targets[k, :i] = seq[1:]
      targets[:, i] = 1  # the step's own position must not look like padding
      logits = model.apply({"params": params}, jnp.repeat(inputs[b:b + 1], beam, axis=0),
                           jnp.asarray(targets))
      log_p = np.asarray(jax.nn.log_softmax(logits[:, i]), np.float64)
      vocab = log_p.shape[-1]
      scores = (log_p + np.array([score for _, score in live])[:, None]).reshape(-1)
      cands = [(live[j // vocab][0] + [j % vocab], scores[j]) for j in top(scores, 2 * beam)]
      ended = [seq[-1] == eos for seq, _ in cands]
      alive = [score + neg * e for (_, score), e in zip(cands, ended)]
      live = [(cands[j][0], alive[j]) for j in top(alive, beam)][::-1]
      pool = finished + [(seq + [0] * (length - len(seq)),
                          score / penalty(i + 1) + neg * (not e), e)
                         for (seq, score), e in zip(cands, ended)]
      finished = [pool[j] for j in top([score for _, score, _ in pool], beam)][::-1]
    if any(flag for *_, flag in finished):
      out_seqs.append([seq for seq, _, _ in finished])
      out_scores.append([score for _, score, _ in finished])
    else:
      out_seqs.append([seq + [0] * (length - len(seq)) for seq, _ in live])
      out_scores.append([score for _, score in live])
  return np.array(out_seqs), np.array(out_scores)


@pytest.mark.parametrize("eos", [flax_wmt_search.NO_EOS, 3, 5, 18, 20])
def test_beam_search_is_the_examples(tiny, eos):
  params, inputs, cache = tiny
  seqs, scores = flax_wmt_search.beam_search(params, inputs, cache, beam=3,
                                             decode_len=DECODE_LEN, eos_id=eos)
  want_seqs, want_scores = reference_beam_search(params, inputs, beam=3, decode_len=DECODE_LEN,
                                                 eos=eos)
  np.testing.assert_array_equal(np.asarray(seqs), want_seqs)
  np.testing.assert_allclose(np.asarray(scores), want_scores, rtol=1e-5, atol=1e-4)


def test_beam_search_stops_when_no_live_hypothesis_can_win():
  """`settled`, by hand: 2 sentences, beam 3, length 5: penalty ((5 + 5) / 6) ** 0.6 = 1.3591,
  so the best live hypotheses, -1 and -2, can reach -0.7358 and -1.4716 at best."""
  def settled(live, finished, flags, alpha=0.6):
    return bool(flax_wmt_search.settled(jnp.asarray(live), jnp.asarray(finished),
                                        jnp.asarray(flags), alpha=alpha, length=5))
  flags = np.ones((2, 3), bool)
  live = np.array([[-9.0, -8.0, -1.0], [-9.0, -5.0, -2.0]])  # best last
  finished = np.array([[-0.9, -0.7, -0.5], [-1.4, -1.0, -0.1]])
  assert not settled(live, finished, flags)  # sentence 0's worst, -0.9, is below -0.7358
  finished[0, 0] = -0.73
  assert settled(live, finished, flags)  # -0.73 > -0.7358 and -1.4 > -1.4716
  flags[1, 2] = False  # a slot not filled yet: the finished set is not full
  assert not settled(live, finished, flags)
  flags[1, 2] = True
  finished[0, 0] = -1.0  # without a penalty (alpha 0), a tie is not a win
  assert not settled(live, finished, flags, alpha=0.0)
  finished[0, 0] = -0.99
  assert settled(live, finished, flags, alpha=0.0)


def test_search_run_reports_each_search(tiny, monkeypatch):
  """`flax_wmt_search.run`: per beam size the median of the timed calls (a stand-in clock), the
  compiling call apart; greedy for beam 1; 0 calls refused."""
  # Each search: the compiling call, then 3 timed ones (seconds), each call a second apart.
  spans = {"greedy": [0.01234, 0.00093, 0.00071, 0.00052],
           "beam 2": [0.2345, 0.00321, 0.00123, 0.00456]}
  ticks = [t for n, span in enumerate(spans["greedy"] + spans["beam 2"])
           for t in (float(n), n + span)]
  clock = iter(ticks)
  monkeypatch.setattr(flax_wmt_search, "time",
                      types.SimpleNamespace(perf_counter=lambda: next(clock)))
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
  out = flax_wmt_search.run((1, 2), rows=2, source_len=5, decode_len=4, calls=3)
  assert (out["rows"], out["source_len"], out["decode_len"]) == (2, 5, 4)
  assert out["glibc_tunables"] == "glibc.malloc.hugetlb=1"
  read = np.diff(ticks)[::2]  # the spans as the clock's differences give them
  for name, first, median in (("greedy", read[0], np.median(read[1:4])),
                              ("beam 2", read[4], np.median(read[5:8]))):
    assert out[name] == {"batch_time_s": round(median, 4), "first_call_s": round(first, 3),
                         "sentences_per_s": round(2 / median, 2)}
  assert out["greedy"] == {"batch_time_s": 0.0007, "first_call_s": 0.012,
                           "sentences_per_s": 2816.9}
  with pytest.raises(ValueError, match="calls=0"):
    flax_wmt_search.run((1,), rows=2, source_len=5, decode_len=4, calls=0)


def test_timed_search_returns_the_sequences(tiny):
  """What the benchmark times returns the hypotheses (greedy's tokens, beam search's sequences),
  so that XLA cannot drop any of the search's work as unused."""
  params, inputs, cache = tiny
  tokens = flax_wmt_search.search_fn(1, DECODE_LEN)(params, inputs, cache)
  np.testing.assert_array_equal(
      tokens, flax_wmt_search.greedy(params, inputs, cache, decode_len=DECODE_LEN))
  seqs = flax_wmt_search.search_fn(3, DECODE_LEN)(params, inputs, cache)
  np.testing.assert_array_equal(seqs, flax_wmt_search.beam_search(
      params, inputs, cache, beam=3, decode_len=DECODE_LEN)[0])
