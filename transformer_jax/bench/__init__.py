"""Measuring the code: throughput benchmarks and the accelerator parity checks.

Modules: common (environment, load, peak memory, the printed table, synthetic batches), train
(the compiled train step), decode (greedy and beam search), data (the input pipeline), profile
(device time per kernel from a trace), accelerator (cuDNN attention and bfloat16 against
float32 references), flax_wmt (the Flax WMT example's model, the CPU comparison point). The
command lines are `scripts/benchmark.py`, `scripts/check_accelerator.py` and
`scripts/baseline_flax_wmt.py`. Nothing is imported here: `bench.train` loads without the data
stack (tensorflow-datasets, grain).
"""
