"""scripts/check_accelerator.py's checks (transformer_jax/bench/accelerator.py) judge what they
should: the inputs are the masks and batches they name, the errors are measured against a float32
reference, and a kernel that is wrong in its output, its gradient or its padding rows fails. The
run on CPU that passes end to end is in tests/test_benchmark.py; these take the parts one by one,
on hand-made rows and a deliberately broken attention, so that a check which passes everything
cannot go unnoticed before a GPU run relies on it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import layers
from transformer_jax.attention import LengthMask
from transformer_jax.bench import accelerator as acc
from transformer_jax.config import model_config

from scripts_under_test import load_script


def test_packed_segments_are_whole_sentences_and_positions_restart_in_each():
  seg = acc.packed_segments(np.random.default_rng(0), 4, 20, max_segments=5)
  assert seg.shape == (4, 20) and seg.dtype == np.int32
  for r, row in enumerate(seg):
    n = int(np.sum(row > 0))
    assert np.all(row[:n] > 0) and np.all(row[n:] == 0)  # padding only at the end
    assert (n < 20) == (r % 2 == 1)  # every other row ends in padding
    assert list(row[:n]) == sorted(row[:n]) and set(row[:n]) == {1, 2, 3, 4, 5}
  assert acc.positions_of(np.array([[1, 1, 2, 2, 2, 0, 0], [1, 2, 2, 3, 3, 3, 3],
                                    [1, 1, 1, 1, 1, 1, 1]])).tolist() == [
      [0, 1, 0, 1, 2, 0, 0], [0, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]]
  # 6 sentences by default, in every row; a sentence may be one token long, but never empty.
  many = acc.packed_segments(np.random.default_rng(1), 200, 8)
  assert all(set(row[row > 0]) == set(range(1, 7)) for row in many)
  assert {int(np.sum(row == 1)) for row in many} == {1, 2}
  pos = acc.positions_of(seg)
  for r, c in np.ndindex(*seg.shape):
    s = seg[r, c]
    assert pos[r, c] == (c - np.flatnonzero(seg[r] == s)[0] if s else 0)


def test_the_attention_cases_are_the_masks_they_name():
  batch, q_len, kv_len = 4, 16, 20
  cases = acc.attention_cases(np.random.default_rng(3), batch, q_len, kv_len)
  # The same draws again, the masks built here with NumPy.
  rng = np.random.default_rng(3)
  lengths = rng.integers(q_len // 4, q_len + 1, batch)
  kv_lengths = rng.integers(kv_len // 4, kv_len + 1, batch)
  kv_lengths[0] = 0
  seg_q = acc.packed_segments(rng, batch, q_len)
  seg_kv = acc.packed_segments(rng, batch, kv_len)
  valid = np.arange(q_len) < lengths[:, None]
  kv_valid = np.arange(kv_len) < kv_lengths[:, None]
  tril = np.tril(np.ones((q_len, q_len), bool))

  def pairs(a, b):  # [batch, q], [batch, kv] -> [batch, 1, q, kv]
    return a[:, None, :, None] & b[:, None, None, :]

  def same(a, b):
    return (a[:, None, :, None] == b[:, None, None, :]) & (b[:, None, None, :] > 0)

  padding = pairs(valid, valid)
  expected = {
      "no mask": (q_len, None),
      "padding": (q_len, padding),
      "causal + padding": (q_len, padding & tril),
      "packed self (causal)": (q_len, same(seg_q, seg_q) & tril),
      "packed cross": (kv_len, same(seg_q, seg_kv)),
      "cross, no mask": (kv_len, None),
      "cross, padding": (kv_len, pairs(valid, np.ones((batch, kv_len), bool))),
      "packed cross, equal lengths": (q_len, same(seg_q, seg_kv[:, :q_len])),
      "padding as lengths": (q_len, padding),
      "causal + padding as lengths": (q_len, padding & tril),
      "cross, padding as lengths": (kv_len, pairs(valid, kv_valid)),
  }
  assert [c[0] for c in cases] == list(expected)
  for name, tq, tk, mask in cases:
    want_tk, want = expected[name]
    assert (tq, tk) == (q_len, want_tk), name
    assert isinstance(mask, LengthMask) == name.endswith("as lengths"), name
    if isinstance(mask, LengthMask):
      assert mask.causal == name.startswith("causal"), name
      mask = mask.dense(tq, tk)
    if want is None:
      assert mask is None, name
    else:
      np.testing.assert_array_equal(np.broadcast_to(np.asarray(mask), want.shape), want,
                                    err_msg=name)
  # Row 0 of the cross-attention given as lengths has no keys: its queries attend nowhere.
  assert not kv_valid[0].any() and kv_valid[1:].any()
  for name, _, _, mask in cases:  # the lengths themselves, as cuDNN takes them
    if isinstance(mask, LengthMask):
      keys = kv_lengths if name.startswith("cross") else lengths
      assert np.array_equal(mask.query_lengths, lengths) and mask.query_lengths.dtype == jnp.int32
      assert np.array_equal(mask.key_lengths, keys) and mask.key_lengths.dtype == jnp.int32
  # The packed cross-attention pairs query sentence s with source sentence s: each row has the
  # same sentences on both sides.
  for r in range(batch):
    assert set(seg_q[r][seg_q[r] > 0]) == set(seg_kv[r][seg_kv[r] > 0]) == set(range(1, 7))


def test_the_model_checks_batches_pair_sentences_and_pad_at_the_end():
  rng = np.random.default_rng(1)
  packed = acc.packed_batch(rng, 4, 24, vocab=50)
  assert set(packed) == {"inputs", "targets", "inputs_positions", "targets_positions",
                         "inputs_segmentation", "targets_segmentation"}
  for side in ("inputs", "targets"):
    tokens, seg = packed[side], packed[f"{side}_segmentation"]
    assert tokens.dtype == np.int32 and tokens.shape == (4, 24)
    assert np.array_equal(tokens > 0, seg > 0)  # a token wherever a sentence is
    assert tokens[seg > 0].min() >= 4 and tokens.max() < 50  # no special ids, within vocab
    assert np.array_equal(packed[f"{side}_positions"], acc.positions_of(seg))
  for r in range(4):  # source sentence s with target sentence s, none without its pair
    src, tgt = packed["inputs_segmentation"][r], packed["targets_segmentation"][r]
    assert set(src[src > 0]) == set(tgt[tgt > 0])
  padded = acc.padded_batch(rng, 64, 24, vocab=50)
  assert set(padded) == {"inputs", "targets"}
  for tokens in padded.values():
    n = np.sum(tokens > 0, axis=1)
    assert np.array_equal(tokens > 0, np.arange(24) < n[:, None])  # right-padded
    assert n.min() == 24 // 4 and n.max() == 24  # a quarter of the row to all of it
    assert tokens[tokens > 0].min() >= 4 and tokens.max() < 50


def test_relative_errors_and_the_row_printed():
  assert acc.rel_err([3.0, 4.0], [0.0, 0.0]) == pytest.approx(5 / 1e-30)
  assert acc.rel_err([1.0, 2.0], [1.0, 1.0]) == pytest.approx(1 / np.sqrt(2))
  assert acc.rel_err([0.2], [0.1]) == pytest.approx(1.0)  # small values: relative all the same
  assert acc.tree_rel_err({"a": np.array([0.02])}, {"a": np.array([0.01])}) == pytest.approx(1.0)
  assert np.isnan(acc.rel_err([1.0, np.inf], [1.0, 1.0]))
  assert np.isnan(acc.rel_err([np.nan, 1.0], [1.0, 1.0]))
  out = {"a": np.array([1.0, 2.0]), "b": np.array([[2.0]])}
  ref = {"a": np.array([1.0, 1.0]), "b": np.array([[1.0]])}
  assert acc.tree_rel_err(out, ref) == pytest.approx(np.sqrt(2 / 3))  # all leaves as one vector
  assert acc.tree_rel_err(ref, ref) == 0.0
  assert acc.tree_rel_err({"a": np.array([1.0])}, {"a": np.array([0.0])}) == pytest.approx(1e15)
  assert np.isnan(acc.tree_rel_err({"a": np.array([1.0, np.nan]), "b": ref["b"]}, ref))
  kernel = {"check": "attention: padding", "cudnn_kernel": True, "output_err": 0.00123,
            "grad_err": 0.0456, "xla_bf16_output_err": 0.002, "xla_bf16_grad_err": 0.003,
            "passed": True}
  assert acc.line(kernel) == (f"{'attention: padding':<42}  True    1.23e-03   4.56e-02 "
                              f"{'2.00e-03/3.00e-03':>20}  PASS")
  model = {"check": "model tiny: bf16", "cudnn_kernel": False, "logits_err": 0.5, "grad_err": 1,
           "loss": 2.0, "reference_loss": 2.125, "passed": False}
  assert acc.line(model) == (f"{'model tiny: bf16':<42} False    5.00e-01   1.00e+00 "
                             f"{'loss 2.00000 vs 2.12500':>20}  FAIL")


@pytest.mark.parametrize("change, passed", [
    ({}, True),
    ({"output_err": 0.01}, False), ({"output_err": 0.0099}, True),
    ({"grad_err": 0.01}, False), ({"grad_err": 0.0099}, True),
    ({"output_err": float("nan")}, False), ({"grad_err": float("nan")}, False),
    ({"dead_rows_zero": False}, False),
    ({"cudnn_kernel": False}, False),  # required here
])
def test_the_kernel_checks_rule(change, passed):
  row = {"output_err": 0.005, "grad_err": 0.005, "dead_rows_zero": True, "cudnn_kernel": True,
         **change}
  assert acc.attention_passed(row, 0.01, require_cudnn=True) is passed
  row["cudnn_kernel"] = False  # not required: never decides
  assert acc.attention_passed(row, 0.01, require_cudnn=False) is (passed or change == {
      "cudnn_kernel": False})


@pytest.mark.parametrize("change, passed", [
    ({}, True),
    ({"loss_rel_diff": 0.01}, False), ({"loss_rel_diff": 0.0099}, True),
    ({"logits_err": 0.05}, False), ({"logits_err": 0.0499}, True),
    ({"grad_err": 0.1}, False), ({"grad_err": 0.0999}, True),
    ({"loss": float("nan")}, False), ({"loss": float("inf")}, False),
    ({"logits_err": float("nan")}, False), ({"grad_err": float("nan")}, False),
    ({"cudnn_kernel": False}, False),  # needed here
])
def test_the_model_checks_rule(change, passed):
  row = {"loss": 3.0, "loss_rel_diff": 0.005, "logits_err": 0.02, "grad_err": 0.05,
         "cudnn_kernel": True, **change}
  assert acc.model_passed(row, 0.01, needs_kernel=True) is passed
  row["cudnn_kernel"] = False
  assert acc.model_passed(row, 0.01, needs_kernel=False) is (passed or change == {
      "cudnn_kernel": False})


def test_padding_rows_must_be_exact_zeros():
  mask = np.zeros((2, 1, 3, 4), bool)
  mask[0, 0, :2, :3] = True   # row 0: query 2 attends nowhere
  mask[1, 0, :, :1] = True    # row 1: every query attends
  out = np.ones((2, 3, 2, 5), np.float32)
  assert not acc.dead_rows_zero(out, jnp.asarray(mask))
  out[0, 2] = 0.0
  assert acc.dead_rows_zero(out, jnp.asarray(mask))
  out[0, 2, 1, 4] = -1e-30  # one value in one head is enough
  assert not acc.dead_rows_zero(out, jnp.asarray(mask))
  assert acc.dead_rows_zero(out, None)  # no mask: nothing must be zero
  shared = np.zeros((1, 1, 3, 4), bool)
  shared[0, 0, 1:] = True  # one mask for every row: query 0 attends nowhere in either
  out = np.ones((2, 3, 2, 5), np.float32)
  out[:, 0] = 0.0
  assert acc.dead_rows_zero(out, jnp.asarray(shared))
  out[1, 0, 0, 0] = 1.0
  assert not acc.dead_rows_zero(out, jnp.asarray(shared))


@pytest.fixture(scope="module")
def one_case():
  """The padding case alone, on 2 rows of 8 queries (its last rows attend nowhere)."""
  cases = acc.attention_cases(np.random.default_rng(0), 2, 8, 10)
  (case,) = [c for c in cases if c[0] == "padding"]
  assert not np.asarray(case[3]).any(axis=-1).all()  # some query attends nowhere
  return case


@pytest.mark.parametrize("broken, what", [
    (None, None),
    (lambda o: o * 1.05, "output"),
    # The output as it is, its gradient 5% too large.
    (lambda o: o + 0.05 * (o - jax.lax.stop_gradient(o)), "grad"),
    (lambda o: o + 1e-6, "padding"),
    (lambda o: o * jnp.nan, "nan"),
])
def test_a_broken_attention_fails_its_check(monkeypatch, one_case, broken, what):
  cfg = model_config("tiny", dtype="bfloat16", attention_impl="cudnn",
                     attention_dropout_rate=0.0)
  fused = layers.fused_attention
  if broken is not None:
    monkeypatch.setattr(layers, "fused_attention",
                        lambda *args, **kw: broken(fused(*args, **kw)))
  monkeypatch.setattr(acc, "attention_cases", lambda rng, b, q, kv: [one_case])
  (row,) = acc.check_attention(cfg, np.random.default_rng(0), 2, 8, 10, 1e-2,
                               require_cudnn=False)
  assert row["check"] == "attention: padding" and row["shape"] == [2, 8, 8, 4, 8]
  assert row["cudnn_kernel"] is False  # CPU: XLA's attention
  assert row["passed"] is (what is None), row
  assert row["dead_rows_zero"] is (what not in ("padding", "nan")), row
  # bfloat16 against the float32 reference: a small error, never none; the XLA path alike.
  assert 1e-4 < row["xla_bf16_output_err"] < 1e-2 and 1e-4 < row["xla_bf16_grad_err"] < 1e-2
  if what in (None, "padding"):
    assert 1e-4 < row["output_err"] < 1e-2 and 1e-4 < row["grad_err"] < 1e-2, row
  elif what == "output":  # 5% on every value: about 0.05 in both
    assert row["output_err"] == pytest.approx(0.05, abs=0.01), row
    assert row["grad_err"] == pytest.approx(0.05, abs=0.01), row
  elif what == "grad":
    assert row["output_err"] < 1e-2 and row["grad_err"] == pytest.approx(0.05, abs=0.01), row
  else:
    assert np.isnan(row["output_err"]), row
  if what is None:  # a GPU's check also needs cuDNN's kernel, which XLA's path lacks
    (row,) = acc.check_attention(cfg, np.random.default_rng(0), 2, 8, 10, 1e-2,
                                 require_cudnn=True)
    assert row["passed"] is False and row["cudnn_kernel"] is False


def test_run_checks_passes_only_when_every_check_does(monkeypatch, capsys):
  calls, draws = [], []

  def attention(cfg, rng, batch, q_len, kv_len, tolerance, require_cudnn):
    calls.append(("attention", cfg.dtype, cfg.attention_impl, batch, q_len, kv_len, tolerance,
                  require_cudnn))
    draws.append(int(rng.integers(1 << 30)))
    return [{"passed": True}, {"passed": True}]

  def model(size, rng, rows, length, vocab, tolerance, require_cudnn):
    calls.append(("model", size, rows, length, vocab, tolerance, require_cudnn))
    return [{"passed": failing_model is False}]

  monkeypatch.setattr(acc, "check_attention", attention)
  monkeypatch.setattr(acc, "check_model", model)
  failing_model = False
  summary = acc.run_checks("tiny", batch=3, length=16, model_rows=5, vocab=99, tolerance=0.02)
  assert calls == [("attention", "bfloat16", "cudnn", 3, 16, 20, 0.02, False),
                   ("model", "tiny", 5, 16, 99, 0.02, False)]
  assert summary["passed"] and len(summary["results"]) == 3
  assert summary["platform"] == "cpu" and summary["tolerance"] == 0.02
  assert "tolerance 0.02 (model logits: 0.1, gradients: 0.2)" in capsys.readouterr().out
  failing_model = True
  assert not acc.run_checks("tiny", batch=3, length=16, model_rows=5, vocab=99)["passed"]
  calls.clear()
  summary = acc.run_checks("tiny", batch=3, length=16, skip_model=True)
  assert [c[0] for c in calls] == ["attention"] and summary["passed"]
  # The defaults (scripts/check_accelerator.py's too), on a machine of one device.
  calls.clear()
  devices = jax.devices
  monkeypatch.setattr(jax, "devices", lambda *a: devices(*a)[:1])
  summary = acc.run_checks()
  assert calls == [("attention", "bfloat16", "cudnn", 8, 256, 320, 0.01, False),
                   ("model", "base", 8, 256, 8000, 0.01, False)]
  assert summary["device_kind"] == devices()[0].device_kind and summary["tolerance"] == 0.01
  assert draws[-1] == np.random.default_rng(0).integers(1 << 30)  # seed 0
  acc.run_checks(seed=5)
  assert draws[-1] == np.random.default_rng(5).integers(1 << 30)


def test_a_gpus_model_check_needs_cudnns_kernel_where_cudnn_was_asked_for():
  # On CPU there is no kernel: with require_cudnn the two cuDNN rows fail and the XLA row, which
  # never needs it, passes (a tolerance so wide that only the kernel decides).
  rows = acc.check_model("tiny", np.random.default_rng(0), 2, 8, 32, tolerance=1.0,
                         require_cudnn=True)
  assert [(r["check"], r["cudnn_kernel"], r["passed"]) for r in rows] == [
      ("model tiny: bfloat16, XLA attention", False, True),
      ("model tiny: bfloat16, cuDNN attention", False, False),
      ("model tiny (padded): bf16, cuDNN, lengths", False, False)]
  for r in rows:  # the loss per real target token: about ln(32) for an untrained model
    assert 2.5 < r["reference_loss"] < 5.0 and r["shape"] == [2, 8], r


@pytest.mark.parametrize("argv, message", [
    (["--size", "huge"], "--size=huge: value should be one of <tiny|small|base|big>"),
    (["--length", "6"], f"--length=6: must be >= {acc.MIN_LENGTH}: the packed checks put 6 "
     "sentences in every row"),
    (["--batch", "0"], "--batch=0"),
    (["--vocab", "4"], "--vocab=4"),
    (["--tolerance", "0"], "--tolerance=0.0: must be > 0"),
])
def test_check_accelerator_refuses_what_its_checks_cannot_run(argv, message, capsys):
  assert load_script("check_accelerator").main(argv) == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err, err
  # The shortest length it accepts runs: every packed row holds its sentences.
  assert acc.MIN_LENGTH == acc.PACKED_SENTENCES + 1
  segments = acc.packed_segments(np.random.default_rng(0), 2, acc.MIN_LENGTH)
  assert all(set(row[row > 0]) == set(range(1, 7)) for row in segments[::2])
