"""Scratch (not part of the package): does a train state of a few flat vectors, instead of one
array per parameter and moment, shorten the host's dispatch and the one-by-one step?

  python scripts/flat_state_experiment.py [base|big] [rounds]

A: TrainSetup.train_step as the tree stands (flatten_optimizer on: 157 arrays for base).
B: the same step function, its state packed as one vector per dtype (4 arrays), unpacked by
   slices inside the program and packed again by a concatenate at its end.
Interleaved A B A B; medians of 20 one-by-one steps after 5 warm-up; back to back 20 steps.
"""
import importlib.util, json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np

arg = sys.argv[1] if len(sys.argv) > 1 else "base"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
spec = importlib.util.spec_from_file_location("c", "configs/wmt14_ende.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
config = m.get_config(arg)
on_cpu = jax.devices()[0].platform == "cpu"
if on_cpu:  # a shape this CPU can step in seconds
  config.data.batch_size, config.data.max_source_len, config.data.max_target_len = 4, 32, 32
  config.model.num_encoder_layers = config.model.num_decoder_layers = 2; config.data.vocab_size = 1000
else:
  config.model.dtype = "bfloat16"; config.model.attention_impl = "cudnn"; config.model.fused_qkv = True
config.flatten_optimizer = True
from transformer_jax.experiment import transformer_config
from transformer_jax.steps import TrainSetup, make_train_step
from transformer_jax.bench import common
from transformer_jax import flops, sharding

model_cfg = transformer_config(config, config.data.vocab_size)
setup = TrainSetup(config, model_cfg)
raw = make_train_step(setup.model, setup.tx, setup.schedule, config.label_smoothing, 1)
state0 = setup.init_state(jax.random.key(config.seed))
host = common.synthetic_batches(config, model_cfg.vocab_size, 4)
batches = [sharding.global_batch(b, setup.batch_sharding) for b in host]
work = flops.train_flops(model_cfg, *flops.batch_lengths(host[0], model_cfg.pad_id))

leaves, treedef = jax.tree.flatten(state0)
dtypes = sorted({str(x.dtype) for x in leaves})
groups = {d: [i for i, x in enumerate(leaves) if str(x.dtype) == d] for d in dtypes}
shapes = [x.shape for x in leaves]

def pack(state):
  ls = jax.tree.leaves(state)
  return {d: jnp.concatenate([ls[i].reshape(-1) for i in idx]) for d, idx in groups.items()}

def unpack(flat):
  ls = [None] * len(shapes)
  for d, idx in groups.items():
    off = 0
    for i in idx:
      n = int(np.prod(shapes[i], dtype=np.int64))
      ls[i] = flat[d][off:off + n].reshape(shapes[i]); off += n
  return jax.tree.unflatten(treedef, ls)

def flat_step(flat, batch):
  state, metrics = raw(unpack(flat), batch)
  return pack(state), metrics

with setup.context():
  step_b = jax.jit(flat_step, donate_argnums=0)
  pack_j = jax.jit(pack)

def timed(step, state, steps=20, warmup=5):
  with setup.context():
    t = time.perf_counter(); state, mt = step(state, batches[0]); jax.block_until_ready((state, mt))
    first = time.perf_counter() - t
    for i in range(1, warmup):
      state, mt = step(state, batches[i % 4])
    jax.block_until_ready((state, mt))
    times, disp = [], []
    for i in range(steps):
      t = time.perf_counter(); state, mt = step(state, batches[i % 4]); disp.append(time.perf_counter() - t)
      jax.block_until_ready((state, mt)); times.append(time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(steps):
      state, mt = step(state, batches[i % 4])
    jax.block_until_ready((state, mt))
    b2b = (time.perf_counter() - t) / steps
  return state, dict(first_s=round(first, 2), step_ms=round(statistics.median(times) * 1e3, 2),
                     dispatch_ms=round(statistics.median(disp) * 1e3, 2), b2b_ms=round(b2b * 1e3, 2),
                     loss=float(mt["loss"] / mt["tokens"]),
                     arrays=len(jax.tree.leaves(state)))

peak = 989e12 if not on_cpu else None
print(f"flat_state: {arg}, device {jax.devices()[0].device_kind}, jax {jax.__version__}, "
      f"{len(leaves)} state arrays -> {len(groups)} vectors ({', '.join(dtypes)}); {work / 1e12:.3f} TFLOP a step")
for r in range(rounds):
  for name in ("tree", "flat"):
    fresh = jax.tree.map(jnp.copy, state0)
    if name == "tree":
      _, out = timed(setup.train_step, fresh)
    else:
      _, out = timed(step_b, pack_j(fresh))
    if peak:
      out["mfu"] = round(work / (out["step_ms"] / 1e3) / peak * 100, 2)
      out["mfu_b2b"] = round(work / (out["b2b_ms"] / 1e3) / peak * 100, 2)
    print(json.dumps({"what": "flat_state", "model": arg, "variant": name, "round": r, **out}), flush=True)
