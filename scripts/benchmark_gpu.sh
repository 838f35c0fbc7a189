#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md in one go: the correctness checks of the fast paths,
# then the train-step benchmarks (base and big, bf16, cuDNN vs XLA attention, fused QKV, remat),
# then decoding. Each run appends its JSON line to OUT_DIR/results.jsonl; logs go to OUT_DIR too.
#
#   bash scripts/benchmark_gpu.sh /tmp/gpu_bench [deadline_seconds] [group]
#
# group: all (default), check, train, extra, decode; profile and ablation (not in all).
# Environment: STEPS (timed steps, default 30), CHECK_SIZE (model size of the checks, base). Runs that would start after the deadline
# (default 540 s from the start) are skipped and listed, so the whole fits a time-limited lease.
set -u
OUT_DIR=${1:-/tmp/gpu_bench}
DEADLINE=$(( $(date +%s) + ${2:-540} ))
GROUP=${3:-all}
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BF16="--config.model.dtype=bfloat16"
CUDNN="$BF16 --config.model.attention_impl=cudnn"
STEPS="--steps ${STEPS:-30} --warmup 5"
skipped=()

run() {  # run NAME ARGS...: one benchmark, unless past the deadline
  local name=$1; shift
  if (( $(date +%s) >= DEADLINE )); then skipped+=("$name"); return; fi
  echo "=== $name: $*" | tee -a "$OUT_DIR/summary.txt"
  local left=$(( DEADLINE - $(date +%s) + 30 ))
  timeout "$left" ${PRE:-} $PY "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  grep '^{"what"' "$OUT_DIR/$name.log" | sed "s/^{/{\"run\": \"$name\", /" >> "$OUT_DIR/results.jsonl"
  grep -v '^{' "$OUT_DIR/$name.log" | grep -E 'step time|target tokens/s|MFU|peak memory|compilations|batch time|sentences/s|^  [a-z(]|%  ' \
    | head -45 | tee -a "$OUT_DIR/summary.txt"
  (( rc == 0 )) || { echo "!!! $name exited $rc"; tail -25 "$OUT_DIR/$name.log"; } | tee -a "$OUT_DIR/summary.txt"
}

B="scripts/benchmark.py --what train $STEPS"
if [[ $GROUP == all || $GROUP == check ]]; then
  run check scripts/check_accelerator.py --size "${CHECK_SIZE:-base}" --json "$OUT_DIR/check.json"
fi
if [[ $GROUP == all || $GROUP == train ]]; then
  run base_cudnn $B --config configs/wmt14_ende.py:base $CUDNN
  run big_cudnn $B --config configs/wmt14_ende.py:big $CUDNN
  run base_xla $B --config configs/wmt14_ende.py:base $BF16
  run big_xla $B --config configs/wmt14_ende.py:big $BF16
  run big_cudnn_fused $B --config configs/wmt14_ende.py:big $CUDNN --config.model.fused_qkv=True
  run base_cudnn_fused $B --config configs/wmt14_ende.py:base $CUDNN --config.model.fused_qkv=True
fi
if [[ $GROUP == profile ]]; then  # where the device time goes
  run base_profile $B --config configs/wmt14_ende.py:base $CUDNN --config.model.fused_qkv=True \
    --profile_dir "$OUT_DIR/trace_base"
  run big_profile $B --config configs/wmt14_ende.py:big $CUDNN --config.model.fused_qkv=True \
    --profile_dir "$OUT_DIR/trace_big"
fi
if [[ $GROUP == ablation ]]; then  # dropout's cost, and whether it is in the random bits
  PRE="env JAX_DEFAULT_PRNG_IMPL=unsafe_rbg" run base_rbg $B --config configs/wmt14_ende.py:base \
    $CUDNN --config.model.fused_qkv=True
  run base_nodropout $B --config configs/wmt14_ende.py:base $CUDNN --config.model.fused_qkv=True \
    --config.model.dropout_rate=0.0
fi
if [[ $GROUP == all || $GROUP == extra ]]; then
  run big_cudnn_remat $B --config configs/wmt14_ende.py:big $CUDNN --config.model.remat=layer
  run base_cudnn_128 $B --config configs/wmt14_ende.py:base $CUDNN \
    --config.data.batch_size=200 --config.data.max_source_len=128 --config.data.max_target_len=128
  run base_f32 $B --config configs/wmt14_ende.py:base
fi
if [[ $GROUP == all || $GROUP == decode ]]; then
  run decode_base scripts/benchmark.py --what decode --config configs/wmt14_ende.py:base \
    --beams 1,4 --steps 5 --decode_rows 64 --decode_len 64 --config.data.max_source_len=64 $BF16
fi
(( ${#skipped[@]} )) && echo "skipped (deadline): ${skipped[*]}" | tee -a "$OUT_DIR/summary.txt"
exit 0
