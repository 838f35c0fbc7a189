"""Where the device time of a traced step goes: a summary of the Perfetto trace that
`jax.profiler.trace(dir, create_perfetto_trace=True)` writes, per kernel and per category."""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re

# Device-time categories of a profile, by kernel / op name (cuBLAS and CUTLASS GEMMs show as
# nvjet_*, sm90_xmma_*, cutlass_*; XLA:CPU's matmuls as ynn_fusion / dot).
CATEGORIES = (("attention (cuDNN)", r"fmha|flash|cudnn"),
              ("matmul", r"gemm|cublas|nvjet|xmma|cutlass|matmul|\bdot|ynn"),
              ("random bits (dropout)", r"threefry|rng|random"),
              ("copy / transpose", r"copy|transpose|memcpy|memset"),
              ("reduction / elementwise fusion", r"fusion|reduce|^loop|^input"))

# On CPU, XLA's ops run on the host's threads beside the runtime's own spans (C++ methods such
# as PjRt's ExecuteHelper, thread-pool waits, end markers), which are not the step's work.
_CPU_RUNTIME = ("Pjit", "jit_", "ThunkExecutor", "SlinkyThreadPool", "end: ", "Handle", "Wait",
                "Parse", "Allocate")


def _events(trace_dir: str) -> tuple[str, list[dict]] | None:
  """(path, events) of the newest trace under `trace_dir`, or None when there is none."""
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True),
                 key=os.path.getmtime)
  if not paths:
    return None
  with gzip.open(paths[-1]) as f:
    return paths[-1], json.load(f)["traceEvents"]


def _kernel_spans(events: list[dict]) -> tuple[list[dict], str]:
  """(the complete events that are kernels or ops, where they ran)."""
  names = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  device_pids = {pid for pid, n in names.items() if "/device:" in n and "CPU" not in n}
  if device_pids:
    chosen = [e for e in events if e.get("ph") == "X" and e["pid"] in device_pids]
    return chosen, "device streams: " + ", ".join(sorted(names[p] for p in device_pids))
  chosen = [e for e in events if e.get("ph") == "X" and "$" not in e.get("name", "")
            and "::" not in e.get("name", "") and not e.get("name", "").startswith(_CPU_RUNTIME)]
  return chosen, "host threads (CPU backend)"


def trace_summary(trace_dir: str, steps: int, top: int = 25) -> dict:
  """Device time per kernel (accelerators) or per op (CPU) from the newest trace under
  `trace_dir`, summed over the `steps` traced steps, with shares; printed and returned."""
  found = _events(trace_dir)
  if found is None:
    return {"error": f"no *.trace.json.gz under {trace_dir}"}
  path, events = found
  chosen, where = _kernel_spans(events)
  per_name = collections.Counter()
  for e in chosen:
    per_name[e["name"]] += float(e.get("dur", 0))
  total = sum(per_name.values()) or 1.0
  categories = collections.Counter()
  for name, us in per_name.items():
    label = next((c for c, pattern in CATEGORIES if re.search(pattern, name, re.I)), "other")
    categories[label] += us
  print(f"\nprofile ({where}), {steps} steps: {total / steps / 1e3:.1f} ms of kernel time/step")
  for label, us in categories.most_common():
    print(f"  {label:<32} {100 * us / total:5.1f} %")
  for name, us in per_name.most_common(top):
    print(f"  {100 * us / total:5.1f} %  {us / steps / 1e3:8.3f} ms  {name[:110]}")
  return {"trace": path, "where": where, "kernel_ms_per_step": round(total / steps / 1e3, 3),
          "categories": {k: round(v / total, 4) for k, v in categories.most_common()},
          "top": [[n[:200], round(us / steps / 1e3, 4)] for n, us in per_name.most_common(top)]}
