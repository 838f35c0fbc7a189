"""scripts/compare_precision.py's judgement (transformer_jax/bench/precision.py) on hand-made
curves and files: the figures are the arithmetic the docs describe, the rule fails what it should,
the printed table shows the steps it says, and a batches file reads back as it was written. The
two trainings on a tiny model are in tests/test_benchmark.py."""
import numpy as np
import pytest

from transformer_jax.bench import precision

IDS = {"vocab_size": 50, "pad_id": 0, "bos_id": 2, "eos_id": 3}


def test_the_curves_figures():
  ref = [5.0, 4.0, 3.0, 2.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 2.0]  # 12 steps: a tail of 1
  var = [5.5, 4.0, 3.0, 2.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 2.1]
  f = precision.curve_figures(ref, var)
  assert f == pytest.approx({
      "steps": 12, "tail_steps": 1, "reference_tail_loss": 2.0, "variant_tail_loss": 2.1,
      "tail_rel_diff": 0.05, "max_step_rel_diff": 0.1, "median_step_rel_diff": 0.0})
  ref, var = [4.0] * 18 + [2.0, 3.0], [4.4] * 17 + [4.0, 1.0, 3.0]  # 20 steps: a tail of 2
  f = precision.curve_figures(ref, var)
  assert f == pytest.approx({
      "steps": 20, "tail_steps": 2, "reference_tail_loss": 2.5, "variant_tail_loss": 2.0,
      "tail_rel_diff": 0.2, "max_step_rel_diff": 0.5, "median_step_rel_diff": 0.1})
  f = precision.curve_figures([1.0, 3.0, 4.0], [1.5, 2.0, 3.0])  # relative to the reference
  assert f["tail_rel_diff"] == 0.25 and f["median_step_rel_diff"] == pytest.approx(1 / 3)
  assert f["max_step_rel_diff"] == 0.5


@pytest.mark.parametrize("variant, tolerance, passed", [
    ([3.0, 2.0, 2.0], 0.02, True),
    ([3.0, 2.0, 2.0399], 0.02, True), ([3.0, 2.0, 1.9601], 0.02, True),
    ([3.0, 2.0, 2.04], 0.02, False), ([3.0, 2.0, 1.96], 0.02, False),
    ([3.0, 2.0, 2.5], 0.25, False), ([3.0, 2.0, 1.5], 0.25, False),  # exactly: not below
    ([3.0, 2.0, 2.4999], 0.25, True),
    ([9.0, 2.0, 2.0], 0.02, True),                # a single early step is not judged
    ([np.nan, 2.0, 2.0], 0.02, False), ([3.0, np.inf, 2.0], 0.02, False),
    ([3.0, 2.0, np.nan], 0.02, False),
])
def test_the_rule(variant, tolerance, passed):
  assert precision.curves_pass([3.0, 2.0, 2.0], variant, tolerance) is passed
  assert precision.curves_pass([3.0, np.nan, 2.0], [3.0, 2.0, 2.0], tolerance=0.02) is False


def test_the_printed_table_shows_every_tenth_step_and_the_last():
  lines = []
  ref = [float(x) for x in range(30, 5, -1)]  # 25 steps
  var = [x * 1.01 for x in ref]
  figures = precision.curve_figures(ref, var)
  figures.update(params_rel_diff=0.0123)
  options = precision.PrecisionOptions(steps=25, tolerance=0.05)
  precision._print({"reference": ref, "variant": var}, figures, options, True, lines.append)
  assert lines[0] == f"{'step':>6} {'reference':>10} {'variant':>10} {'rel diff':>9}"
  rows = lines[1:-2]
  assert [int(r.split()[0]) for r in rows] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25]
  assert rows[1] == f"{3:>6} {28.0:>10.4f} {28.28:>10.4f} {0.01:>9.2e}"
  assert lines[-2] == ("last 2 steps' mean loss: reference 6.5000, variant 6.5650, relative "
                       "difference 1.00e-02 (tolerance 0.05); largest single step 1.00e-02, "
                       "parameters apart 1.23e-02")
  assert lines[-1] == "PASS"
  lines.clear()
  precision._print({"reference": ref[:3], "variant": var[:3]}, figures, options, False,
                   lines.append)
  assert [int(r.split()[0]) for r in lines[1:-2]] == [1, 2, 3] and lines[-1] == "FAIL"


def test_a_batches_file_reads_back_as_written(tmp_path):
  rng = np.random.default_rng(0)
  batches = [{"inputs": rng.integers(4, 50, (2, 6)).astype(np.int32),
              "targets": rng.integers(4, 50, (2, 5)).astype(np.int32)} for _ in range(12)]
  path = str(tmp_path / "b.npz")
  precision.save(path, batches, IDS)
  read, ids = precision.load(path, 12)
  assert ids == IDS and all(isinstance(v, int) for v in ids.values())
  assert len(read) == 12  # batch 10 and 11 after 1 and 2: in their order, not the names'
  for a, b in zip(read, batches):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  first, _ = precision.load(path, 3)  # fewer than held: the first ones
  assert len(first) == 3 and np.array_equal(first[2]["inputs"], batches[2]["inputs"])
  with pytest.raises(precision.BatchesFileError, match=f"{path} holds 12 batches; 13 steps"):
    precision.load(path, 13)


def test_a_batches_file_of_another_shape_than_the_configs_is_refused(tmp_path):
  import ml_collections
  config = ml_collections.ConfigDict({"data": {"batch_size": 2, "max_source_len": 6,
                                               "max_target_len": 5}})
  path = str(tmp_path / "b.npz")
  precision.save(path, [{"inputs": np.zeros((2, 6), np.int32),
                         "targets": np.zeros((2, 5), np.int32)}], IDS)
  assert len(precision.load(path, 1, config)[0]) == 1
  for field, value in (("batch_size", 3), ("max_source_len", 7), ("max_target_len", 4)):
    other = ml_collections.ConfigDict(config.to_dict())
    other.data[field] = value
    with pytest.raises(precision.BatchesFileError, match="holds batches of"):
      precision.load(path, 1, other)
  precision.save(path, [{"inputs": np.zeros((2, 6), np.int32)}], IDS)  # no targets
  with pytest.raises(precision.BatchesFileError, match=r"holds batches of \{'inputs': \(2, 6\)\}"):
    precision.load(path, 1, config)


def test_the_options_are_checked():
  for kwargs, message in (({"steps": 0}, "steps=0: must be >= 1"),
                          ({"tolerance": 0.0}, "tolerance=0.0: must be > 0"),
                          ({"tolerance": float("nan")}, "tolerance=nan: must be > 0")):
    with pytest.raises(ValueError, match=message):
      precision.PrecisionOptions(**kwargs)
  precision.PrecisionOptions(steps=1, tolerance=1e-9)
  assert precision.PrecisionOptions().variant == (("model.dtype", "bfloat16"),)
