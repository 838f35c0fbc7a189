#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md in one go: the correctness checks of the fast paths,
# then the train-step benchmarks (base and big, bf16, cuDNN vs XLA attention, fused QKV, remat),
# then decoding. Each run appends its JSON line to OUT_DIR/results.jsonl; logs go to OUT_DIR too.
#
#   bash scripts/benchmark_gpu.sh /tmp/gpu_bench [deadline_seconds] [group[,group...]]
#
# groups: all (= check,train,extra,decode), check, train, extra, decode, now (the tree as it
# stands: check, base and big with every fast path), precision (needs PRECISION_BATCHES), scale
# (larger batches per step), flags (XLA flags that may fuse more), graphs (the base step with
# XLA's command buffers, i.e. CUDA graphs, for every single-GPU command type, and with none,
# between two runs as XLA defaults: whether kernel launches make the one-by-one step slower
# than back to back), lengths (base and big with cuDNN given unpacked rows' padding as sequence
# lengths, the default, against the dense mask, interleaved), flat (base and big with
# flatten_optimizer against without, interleaved), compare (needs BASELINE_TREE), profile,
# ablation. An unknown group is an error.
# Environment:
#   STEPS          timed steps (default 30)
#   CHECK_SIZE     model size of the checks (base)
#   PRECOMPILE=N   first compile every train run of the chosen groups, N at a time, into a
#                  persistent compilation cache (one untimed step each, GPU memory not
#                  preallocated), so the timed runs one after another load their programs instead
#                  of compiling them: compilation (27-47 s a run on an H100) is most of a lease
#   PRECISION_BATCHES  an .npz of real batches (compare_precision.py --save_batches) for the
#                  precision group: 200 steps of configs/locale.py:ende in float32 and in bf16
#                  with cuDNN attention (attention dropout off in both: cuDNN's path has none)
#   BASELINE_TREE  other checkouts (earlier commits, or a change left out), comma-separated,
#                  whose base and big steps the compare group times interleaved with this
#                  tree's, in the same minutes: runs base_NAME and big_NAME, NAME the folder's
#                  name
# Runs that would start after the deadline (default 540 s from the start) are skipped and listed,
# so the whole fits a time-limited lease.
set -u
unset XFLAGS   # set per run below (in_tree), never taken from the caller
die() { echo "benchmark_gpu.sh: $*" >&2; exit 2; }
absolute() { [[ -z $1 || $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
OUT_DIR=$(mkdir -p "${1:-/tmp/gpu_bench}" && cd "${1:-/tmp/gpu_bench}" && pwd) \
  || die "cannot create the output directory ${1:-/tmp/gpu_bench}"
DEADLINE=$(( $(date +%s) + ${2:-540} ))
GROUPS_=",${3:-all},"
KNOWN=",all,check,train,extra,decode,now,precision,scale,flags,graphs,lengths,flat,compare,profile,ablation,"
for g in ${GROUPS_//,/ }; do
  [[ $KNOWN == *,$g,* ]] || die "unknown group '$g'; the groups are ${KNOWN:1:-1}"
done
[[ $GROUPS_ == *,all,* ]] && GROUPS_="$GROUPS_,check,train,extra,decode,"
has() { [[ $GROUPS_ == *,$1,* ]]; }
[[ -z ${PRECOMPILE:-} || $PRECOMPILE =~ ^[1-9][0-9]*$ ]] \
  || die "PRECOMPILE=$PRECOMPILE: expected how many to compile at a time, 1 or more"
# Paths the runs use are made absolute here: each run changes into the tree it times.
PY=${PYTHON:-python3}
[[ $PY == */* ]] && PY=$(absolute "$PY")
baselines=()
IFS=, read -ra trees <<< "${BASELINE_TREE:-}"
for tree in ${trees[@]+"${trees[@]}"}; do baselines+=("$(absolute "$tree")"); done
PRECISION_BATCHES=$(absolute "${PRECISION_BATCHES:-}")
if has compare; then
  (( ${#baselines[@]} )) || die "compare: BASELINE_TREE is not set (checkouts of the commits to compare with, comma-separated)"
  # The NAMEs of this tree's own runs (base_now, base_again, base_cb_default, ... in plan below)
  own=(now again cb_default cb_all cb_none cb_default_again dense lengths dense_again lengths_again
       tree flat tree_again flat_again)
  declare -A seen=()
  for name in "${own[@]}"; do seen[$name]=1; done
  for tree in "${baselines[@]}"; do
    [[ -d $tree ]] || die "compare: BASELINE_TREE: '$tree' is not a directory (a checkout of the commit to compare with)"
    name=$(basename "$tree")
    [[ $name =~ ^[A-Za-z0-9_.-]+$ && $name =~ [A-Za-z0-9] && -z ${seen[$name]:-} ]] \
      || die "compare: BASELINE_TREE: the folders' names name the runs (base_NAME): '$name' is used twice, is one of this tree's ($(IFS=,; echo "${own[*]}" | sed 's/,/, /g')), or is not letters, digits, _ . -"
    seen[$name]=1
  done
fi
if has precision && [[ ! -f $PRECISION_BATCHES ]]; then
  die "precision: PRECISION_BATCHES='$PRECISION_BATCHES' is not a file (write one with scripts/compare_precision.py --save_batches)"
fi
if [[ -n ${PRECOMPILE:-} ]]; then
  export JAX_COMPILATION_CACHE_DIR=$(absolute "${JAX_COMPILATION_CACHE_DIR:-$OUT_DIR/jax_cache}")
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
fi
rm -f "$OUT_DIR"/*.done  # a run of an earlier call into the same directory is run again
cd "$(dirname "$0")/.."
HERE=$PWD
BF16="--config.model.dtype=bfloat16"
CUDNN="$BF16 --config.model.attention_impl=cudnn"
FAST="$CUDNN --config.model.fused_qkv=True"
STEPS="--steps ${STEPS:-30} --warmup 5"
MODE=time
skipped=()
declare -A compiling=()
compile_pids=()   # the compilations running beside the checks; only they count against N

compilations_running() {
  local n=0 pid
  for pid in ${compile_pids[@]+"${compile_pids[@]}"}; do
    kill -0 "$pid" 2>/dev/null && n=$(( n + 1 ))
  done
  echo "$n"
}

in_tree() {  # [CWD=tree] [PRE=env...] [XFLAGS=...] in_tree ARGS...: python in the tree, its
  # package first, stopped 30 s past the deadline; XFLAGS is added to XLA_FLAGS whole (PRE is
  # split into words, so it cannot hold a value with spaces)
  local tree=${CWD:-$HERE}
  (cd "$tree" && export PYTHONPATH=$tree${PYTHONPATH:+:$PYTHONPATH} \
     && { [[ -z ${XFLAGS:-} ]] || export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }$XFLAGS"; } \
     && timeout "$(( DEADLINE - $(date +%s) + 30 ))" ${PRE:-} $PY "$@")
}

timed() {  # timed NAME ARGS...: run it now, log, summary and JSON lines to OUT_DIR
  local name=$1; shift
  echo "=== $name: ${CWD:+(in $CWD) }${PRE:+$PRE }${XFLAGS:+XLA_FLAGS=\"$XFLAGS\" }$*" \
    | tee -a "$OUT_DIR/summary.txt"
  in_tree "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  grep '^{"what"' "$OUT_DIR/$name.log" | sed "s/^{/{\"run\": \"$name\", /" >> "$OUT_DIR/results.jsonl"
  grep -v '^{' "$OUT_DIR/$name.log" | grep -E 'step time|target tokens/s|MFU|host dispatch|peak memory|compilations|first step|batch time|sentences/s|^  [a-z(]|%  |PASS|FAIL|mean loss' \
    | head -45 | tee -a "$OUT_DIR/summary.txt"
  (( rc == 0 )) || { echo "!!! $name exited $rc"; tail -25 "$OUT_DIR/$name.log"; } | tee -a "$OUT_DIR/summary.txt"
  touch "$OUT_DIR/$name.done"
}

run() {  # [CWD=tree] [PRE=env...] run NAME ARGS...: one run, unless past the deadline
  local name=$1; shift
  if (( $(date +%s) >= DEADLINE )); then [[ $MODE == time ]] && skipped+=("$name"); return; fi
  if [[ $MODE == time ]]; then
    [[ -e $OUT_DIR/$name.done ]] || timed "$name" "$@"
    return 0
  fi
  # Compile mode. The correctness checks run now, beside the compilations: they are not timed.
  if [[ $name == check || $name == precision ]]; then
    XLA_PYTHON_CLIENT_PREALLOCATE=false timed "$name" "$@" &
    return 0
  fi
  local key="${CWD:-$HERE}"$'\x1f'"${PRE:-}"$'\x1f'"${XFLAGS:-}"$'\x1f'"$*"
  [[ " $* " == *" --what train "* && " $* " != *" --profile_dir "* && -z ${compiling[$key]:-} ]] \
    || return 0
  compiling[$key]=1
  while (( $(compilations_running) >= PRECOMPILE )); do wait -n; done
  (( $(date +%s) < DEADLINE )) || return 0   # the timed run compiles it, if it starts at all
  (XLA_PYTHON_CLIENT_PREALLOCATE=false in_tree "$@" --steps 1 --warmup 1 \
     > "$OUT_DIR/compile_$name.log" 2>&1 \
     || echo "!!! compile $name exited $? (the timed run compiles it)" >> "$OUT_DIR/summary.txt") &
  compile_pids+=($!)
}

interleaved() {  # interleaved A A_ARGS B B_ARGS: base A, base B, big A, big B, base A and B again
  local a=$1 a_args=$2 b=$3 b_args=$4
  run "base_$a" $BASE $FAST $a_args
  run "base_$b" $BASE $FAST $b_args
  run "big_$a" $BIG $FAST $a_args
  run "big_$b" $BIG $FAST $b_args
  run "base_${a}_again" $BASE $FAST $a_args
  run "base_${b}_again" $BASE $FAST $b_args
}

B="scripts/benchmark.py --what train $STEPS"
BASE="$B --config configs/wmt14_ende.py:base"
BIG="$B --config configs/wmt14_ende.py:big"
plan() {
  if has check || has now; then
    run check scripts/check_accelerator.py --size "${CHECK_SIZE:-base}" --json "$OUT_DIR/check.json"
  fi
  if has precision; then  # bf16 + cuDNN against float32 over real batches carried over
    run precision scripts/compare_precision.py --config configs/locale.py:ende \
      --steps "${PRECISION_STEPS:-200}" --batches_file "$PRECISION_BATCHES" \
      --variant model.dtype=bfloat16 --variant model.attention_impl=cudnn \
      --config.model.attention_dropout_rate=0.0 --json "$OUT_DIR/precision.json"
  fi
  if has now || has compare; then
    run base_now $BASE $FAST
    run big_now $BIG $FAST
  fi
  if has compare; then  # interleaved: this tree (above), the baseline, this tree again
    for tree in ${baselines[@]+"${baselines[@]}"}; do
      CWD=$tree run "base_$(basename "$tree")" $BASE $FAST
      CWD=$tree run "big_$(basename "$tree")" $BIG $FAST
    done
    run base_again $BASE $FAST
    run big_again $BIG $FAST
  fi
  if has decode; then
    run decode_base scripts/benchmark.py --what decode --config configs/wmt14_ende.py:base \
      --beams 1,4 --steps 5 --decode_rows 64 --decode_len 64 --config.data.max_source_len=64 $BF16
  fi
  if has flags; then
    PRE="env XLA_FLAGS=--xla_gpu_enable_cudnn_layer_norm=true" run base_cudnn_ln $BASE $FAST
  fi
  if has lengths; then  # the padding as lengths (the default) against the dense mask
    interleaved dense "--config.model.padding_as_lengths=False" lengths ""
  fi
  if has flat; then  # Adam over one flat vector against one array per parameter
    interleaved tree "" flat "--config.flatten_optimizer=True"
  fi
  if has graphs; then  # XLA's default, all command types in graphs, none, the default again
    run base_cb_default $BASE $FAST
    XFLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1" \
      run base_cb_all $BASE $FAST
    XFLAGS="--xla_gpu_enable_command_buffer=" run base_cb_none $BASE $FAST
    run base_cb_default_again $BASE $FAST
  fi
  if has scale; then  # MFU against rows per step (96 rows is the paper's 25k tokens)
    run base_192 $BASE $FAST --config.data.batch_size=192
    run big_192 $BIG $FAST --config.data.batch_size=192
    run base_384 $BASE $FAST --config.data.batch_size=384
  fi
  if has train; then
    run base_cudnn $BASE $CUDNN
    run big_cudnn $BIG $CUDNN
    run base_xla $BASE $BF16
    run big_xla $BIG $BF16
    run big_cudnn_fused $BIG $FAST
    run base_cudnn_fused $BASE $FAST
  fi
  if has profile; then  # where the device time goes
    run base_profile $BASE $FAST --profile_dir "$OUT_DIR/trace_base"
    run big_profile $BIG $FAST --profile_dir "$OUT_DIR/trace_big"
  fi
  if has ablation; then  # dropout's cost, and whether it is in the random bits
    PRE="env JAX_DEFAULT_PRNG_IMPL=unsafe_rbg" run base_rbg $BASE $FAST
    run base_nodropout $BASE $FAST --config.model.dropout_rate=0.0
  fi
  if has extra; then
    run big_cudnn_remat $BIG $CUDNN --config.model.remat=layer
    run base_cudnn_128 $BASE $CUDNN \
      --config.data.batch_size=200 --config.data.max_source_len=128 --config.data.max_target_len=128
    run base_f32 $BASE
  fi
}

if [[ -n ${PRECOMPILE:-} ]]; then
  start=$(date +%s)
  MODE=compile plan
  wait
  echo "precompiled in $(( $(date +%s) - start )) s, $PRECOMPILE at a time" | tee -a "$OUT_DIR/summary.txt"
fi
MODE=time plan
(( ${#skipped[@]} )) && echo "skipped (deadline): ${skipped[*]}" | tee -a "$OUT_DIR/summary.txt"
exit 0
