"""The Flax `examples/wmt` rebuilds that the speed targets are measured against
(`transformer_jax/bench/flax_wmt*.py`, `scripts/baseline_flax_wmt.py`) compute what the example
computes: a comparison with a broken baseline would say nothing. Tiny sizes (the module's
constants, patched)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.bench import flax_wmt, flax_wmt_search

from scripts_under_test import load_script

ROWS, SOURCE_LEN, DECODE_LEN = 3, 7, 6


@pytest.fixture
def tiny(monkeypatch):
  for name, value in dict(V=37, D=16, H=2, F=32, N=2, B=2, L=8).items():
    monkeypatch.setattr(flax_wmt, name, value)
  params = flax_wmt_search.init_params(ROWS, SOURCE_LEN, DECODE_LEN, seed=6)
  inputs = jnp.asarray(np.random.default_rng(1).integers(1, 37, (ROWS, SOURCE_LEN)), jnp.int32)
  inputs = inputs.at[1, 4:].set(0)  # a padded source
  cache = flax_wmt_search.init_cache(ROWS, SOURCE_LEN, DECODE_LEN)
  return params, inputs, cache


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
