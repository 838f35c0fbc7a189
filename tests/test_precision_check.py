"""scripts/compare_precision.py's judgement (transformer_jax/bench/precision.py) on hand-made
curves and files: the figures are the arithmetic the docs describe, the rule fails what it should,
the printed table shows the steps it says, and a batches file reads back as it was written. The
two trainings on a tiny model are in tests/test_benchmark.py."""
import dataclasses
import os

import jax
import numpy as np
import pytest

from transformer_jax.bench import common, precision
from transformer_jax.sweeps.spec import SweepError

import tiny_config

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
  f = precision.curve_figures([2.0] * 18, [2.0] * 17 + [2.2])  # 18 steps: still a tail of 1
  assert f["tail_steps"] == 1 and f["tail_rel_diff"] == pytest.approx(0.1)
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

  def shown(n):
    lines.clear()
    precision._print({"reference": ref[:n], "variant": var[:n]}, figures, options, False,
                     lines.append)
    assert lines[-1] == "FAIL"
    return [int(r.split()[0]) for r in lines[1:-2]]

  assert shown(3) == [1, 2, 3] and shown(18) == list(range(1, 19))
  assert shown(20) == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 20]


def test_a_batches_file_reads_back_as_written(tmp_path):
  rng = np.random.default_rng(0)
  batches = [{"inputs": rng.integers(4, 50, (2, 6)).astype(np.int32),
              "targets": rng.integers(4, 50, (2, 5)).astype(np.int32),
              "a/b": np.arange(i)} for i in range(12)]  # a key may hold a slash
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


def test_arrays_that_are_not_batch_slash_key_are_named(tmp_path):
  tokens = {f"tokenizer/{k}": v for k, v in IDS.items()}
  for names in (["0"], ["x/inputs"], ["0/inputs", "a", "b", "c", "d"]):
    np.savez(tmp_path / "odd.npz", **tokens, **{n: np.zeros(2) for n in names})
    strange = [n for n in names if n != "0/inputs"]
    with pytest.raises(precision.BatchesFileError) as e:
      precision.load(str(tmp_path / "odd.npz"), 1)
    assert f"(arrays {strange[:3]} are not <batch>/<key>)" in str(e.value)  # three at most


def test_a_batches_file_of_another_shape_than_the_configs_is_refused(tmp_path):
  import ml_collections
  config = ml_collections.ConfigDict({"data": {"batching": "pack", "batch_size": 2,
                                               "batch_tokens": 0, "max_source_len": 6,
                                               "max_target_len": 5}})
  path = str(tmp_path / "b.npz")
  precision.save(path, [{"inputs": np.zeros((2, 6), np.int32),
                         "targets": np.zeros((2, 5), np.int32)}], IDS)
  assert len(precision.load(path, 1, config)[0]) == 1
  # With data.batch_tokens, training's rows are batch_tokens // the longest row (12 // 6 = 2),
  # whatever data.batch_size says.
  by_tokens = ml_collections.ConfigDict(config.to_dict())
  by_tokens.data.update(batch_size=7, batch_tokens=12)
  assert len(precision.load(path, 1, by_tokens)[0]) == 1
  by_tokens.data.batch_tokens = 18
  with pytest.raises(precision.BatchesFileError, match=r"the config's are \{'inputs': \(3, 6\)"):
    precision.load(path, 1, by_tokens)
  for field, value in (("batch_size", 3), ("max_source_len", 7), ("max_target_len", 4)):
    other = ml_collections.ConfigDict(config.to_dict())
    other.data[field] = value
    with pytest.raises(precision.BatchesFileError, match="holds batches of"):
      precision.load(path, 1, other)
  precision.save(path, [{"inputs": np.zeros((2, 6), np.int32)}], IDS)  # no targets
  with pytest.raises(precision.BatchesFileError, match=r"holds batches of \{'inputs': \(2, 6\)\}"):
    precision.load(path, 1, config)
  # Every batch is checked, not the first alone (a file put together by hand).
  good = {"inputs": np.zeros((2, 6), np.int32), "targets": np.zeros((2, 5), np.int32)}
  precision.save(path, [good, good, {**good, "targets": np.zeros((2, 4), np.int32)}], IDS)
  assert len(precision.load(path, 2, config)[0]) == 2  # the bad one is not read
  with pytest.raises(precision.BatchesFileError, match=r"'targets': \(2, 4\)\} \(batch 2\)"):
    precision.load(path, 3, config)


def test_the_options_are_checked():
  for kwargs, message in (({"steps": 0}, "steps=0: must be >= 1"),
                          ({"tolerance": 0.0}, "tolerance=0.0: must be > 0"),
                          ({"tolerance": float("nan")}, "tolerance=nan: must be > 0")):
    with pytest.raises(ValueError, match=message):
      precision.PrecisionOptions(**kwargs)
  precision.PrecisionOptions(steps=1, tolerance=1e-9)
  default = precision.PrecisionOptions()
  with pytest.raises(dataclasses.FrozenInstanceError):  # options are fixed once checked
    default.steps = 0
  assert default.variant == (("model.dtype", "bfloat16"),) and default.tolerance == 0.02
  assert default.steps == 200


def test_run_trains_both_curves_on_the_datasets_batches_and_saves_them_when_asked(
    tmp_path, monkeypatch):
  # The two trainings stood in for (tests/test_benchmark.py runs them): what run() reads,
  # passes on, saves and reports around them.
  config = tiny_config.get_config()
  batches = common.synthetic_batches(config, 50, 3)
  asked = []
  monkeypatch.setattr(precision, "dataset_batches",
                      lambda c, workdir, n: asked.append((workdir, n)) or (batches[:n], IDS))
  curves = {"float32": [3.1234567, 2.5, 2.0000004], "bfloat16": [3.2, 2.5, 2.02]}
  trained = []

  def curve(c, model_cfg, host_batches):
    trained.append((model_cfg.dtype, model_cfg.vocab_size, len(host_batches),
                    jax.config.jax_default_matmul_precision))
    scale = 2.0 if model_cfg.dtype == "bfloat16" else 1.0
    return curves[model_cfg.dtype], {"w": np.full(2, scale)}, 1.234

  monkeypatch.setattr(precision, "_curve", curve)
  devices = jax.devices
  monkeypatch.setattr(jax, "devices", lambda *a: devices(*a)[:1])  # a machine of one device
  saved, logged = str(tmp_path / "saved.npz"), []
  result = precision.run(config, precision.PrecisionOptions(
      steps=3, workdir=str(tmp_path / "w"), save_batches=saved), log=logged.append)
  assert asked == [(str(tmp_path / "w"), 3)]
  # The float32 reference at full matmul precision (GPUs default to TF32), the variant as is.
  assert trained == [("float32", 50, 3, "highest"), ("bfloat16", 50, 3, None)]
  assert precision.load(saved, 3)[1] == IDS and f"saved 3 batches to {saved}" in logged
  assert logged[1:3] == [
      "reference: float32 compute (matmuls at highest precision), xla attention, 3 steps",
      "variant: bfloat16 compute, xla attention, 3 steps"]
  assert result["curves"] == {"reference": [3.123457, 2.5, 2.0], "variant": [3.2, 2.5, 2.02]}
  assert result["figures"]["params_rel_diff"] == 1.0
  assert result["figures"]["reference_seconds"] == result["figures"]["variant_seconds"] == 1.23
  assert result["passed"] is True and logged[-1] == "PASS"
  assert result["batches"] == "dataset" and result["device_kind"] == devices()[0].device_kind
  assert result["variant"] == {"model.dtype": "bfloat16"} and result["tolerance"] == 0.02
  os.remove(saved)
  asked.clear()
  logged.clear()
  precision.run(config, precision.PrecisionOptions(steps=2), log=logged.append)
  assert asked == [(common.default_workdir(), 2)]  # the benchmarks' workdir when none is given
  assert not os.path.exists(saved) and not any(m.startswith("saved") for m in logged)


def test_a_variant_the_config_refuses_is_named_before_anything_trains(monkeypatch):
  monkeypatch.setattr(precision, "dataset_batches", lambda *a: pytest.fail("read the data"))
  with pytest.raises(SweepError, match=r"^variant 1 \(.*model.dtype.*bfloat17.*\): "):
    precision.run(tiny_config.get_config(), precision.PrecisionOptions(
        variant=(("model.dtype", "bfloat17"),)))


def test_the_plot_shows_both_curves_their_difference_and_the_tolerance(tmp_path):
  result = {"curves": {"reference": [4.0, 3.0, 2.0], "variant": [4.4, 2.7, 2.0]},
            "variant": {"model.dtype": "bfloat16", "model.fused_qkv": True},
            "tolerance": 0.05}
  fig = precision.figure(result)
  loss_ax, diff_ax = fig.axes
  (ref, var), (diff,) = loss_ax.get_lines(), [line for line in diff_ax.get_lines()
                                              if len(line.get_xdata()) == 3]
  assert list(ref.get_xdata()) == list(var.get_xdata()) == [1, 2, 3]  # steps from 1
  assert list(ref.get_ydata()) == [4.0, 3.0, 2.0] and list(var.get_ydata()) == [4.4, 2.7, 2.0]
  assert var.get_label() == "model.dtype=bfloat16, model.fused_qkv=True"
  np.testing.assert_allclose(diff.get_ydata(), [0.1, 0.1, 0.0])
  (tolerance,) = [line for line in diff_ax.get_lines() if line is not diff]
  assert list(tolerance.get_ydata()) == [0.05, 0.05] and diff_ax.get_yscale() == "log"
  path = str(tmp_path / "p.png")
  assert precision.plot(result, path) == path and open(path, "rb").read(4) == b"\x89PNG"
