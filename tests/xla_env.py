"""XLA flags of the test processes (this one, the scripts it starts, the SLURM and two-process
jobs): fake CPU devices, and XLA's LLVM backend at -O0.

The tests' programs are tiny, so compiling them is most of their time: at -O0 they compile in
about half of it (tests/test_model.py's variants, fused-attention and gradient tests: 136 s ->
75 s). XLA's graph passes (fusion, layout, sharding) still run, so the programs tested are the
ones the code builds; only the machine code is less optimised.
"""
import re

FAST_COMPILE = "--xla_backend_optimization_level=0"


def flags(devices: int, existing: str = "") -> str:
  """`existing` XLA flags with `devices` fake CPU devices and the quick compile."""
  rest = re.sub(r"--xla_force_host_platform_device_count=\d+", "", existing).split()
  rest = [f for f in rest if not f.startswith("--xla_backend_optimization_level=")]
  return " ".join([*rest, f"--xla_force_host_platform_device_count={devices}", FAST_COMPILE])
