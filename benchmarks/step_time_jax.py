"""The JAX side of benchmarks/step_time.py: the same GPT (benchmarks/bench_model.py) in plain
jax.numpy, a jitted training step (forward, backward, Adam written out with torch's defaults),
data parallel over the host's CPU devices with NamedSharding (batch on a 1-D 'data' mesh,
parameters and optimizer state replicated).

Runs in a throw-away venv that has jax (step_time.py creates it); imports neither torch nor
torch_spmd. Parameters and token batches come from an .npz that step_time.py's CPU eager row
wrote (torch's initialization, torch's names and layouts: y = x @ W.T + b), so the first
losses can be checked against torch's. Prints one JSON line: median seconds per step, all
step times and losses, jax's version and device count.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python step_time_jax.py \
        --data params_and_tokens.npz --cfg '{"layers": 4, ...}' --warmup 3 --steps 7
"""
import argparse
import json
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--cfg", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    cfg = json.loads(args.cfg)
    heads = cfg["heads"]
    blob = np.load(args.data)
    tokens = blob["__tokens__"].astype(np.int32)          # [steps, batch, seq + 1]
    params = {k: jnp.asarray(blob[k]) for k in blob.files if k != "__tokens__"}

    devices = jax.devices()
    if len(devices) < args.devices:
        raise SystemExit(f"jax sees {len(devices)} devices, need {args.devices} "
                         "(XLA_FLAGS=--xla_force_host_platform_device_count)")
    mesh = Mesh(np.array(devices[:args.devices]), ("data",))
    replicated = NamedSharding(mesh, P())
    batch_sharded = NamedSharding(mesh, P("data"))

    def linear(p, name, x, bias=True):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if bias else y

    def layer_norm(p, name, x, eps=1e-5):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]

    def block(p, i, x):
        b, s, d = x.shape
        pre = f"blocks.{i}."
        qkv = linear(p, pre + "qkv", layer_norm(p, pre + "ln1", x)).reshape(b, s, heads, 3, d // heads)
        q, k, v = (qkv[:, :, :, j].transpose(0, 2, 1, 3) for j in range(3))   # [b, h, s, hd]
        att = (q @ k.transpose(0, 1, 3, 2)) * (d // heads) ** -0.5
        causal = jnp.triu(jnp.ones((s, s), dtype=bool), 1)
        att = jax.nn.softmax(jnp.where(causal, -jnp.inf, att), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
        x = x + linear(p, pre + "proj", y)
        h = jax.nn.gelu(linear(p, pre + "fc1", layer_norm(p, pre + "ln2", x)), approximate=False)
        return x + linear(p, pre + "fc2", h)

    def loss_fn(p, tok):
        idx, targets = tok[:, :-1], tok[:, 1:]
        x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(idx.shape[1])]
        for i in range(cfg["layers"]):
            x = block(p, i, x)
        logits = linear(p, "head", layer_norm(p, "ln", x), bias=False)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8               # torch.optim.Adam's defaults

    def train_step(p, opt, tok):
        loss, grads = jax.value_and_grad(loss_fn)(p, tok)
        m, v, t = opt
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        p = jax.tree_util.tree_map(
            lambda w, m_, v_: w - (lr / bc1) * m_ / (jnp.sqrt(v_) / jnp.sqrt(bc2) + eps), p, m, v)
        return p, (m, v, t), loss

    step = jax.jit(train_step, in_shardings=(replicated, replicated, batch_sharded),
                   out_shardings=(replicated, replicated, replicated), donate_argnums=(0, 1))
    params = jax.device_put(params, replicated)
    def zeros():  # m and v: distinct buffers (both are donated)
        return jax.tree_util.tree_map(lambda w: jnp.zeros(w.shape, w.dtype), params)

    opt = jax.device_put((zeros(), zeros(), jnp.zeros((), jnp.float32)), replicated)

    times, losses = [], []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        tok = jax.device_put(tokens[i], batch_sharded)
        params, opt, loss = step(params, opt, tok)
        losses.append(float(loss))                          # waits for the step
        times.append(time.perf_counter() - start)
    timed = times[args.warmup:]
    print(json.dumps({"median_s": statistics.median(timed), "times": timed, "losses": losses,
                      "jax_version": jax.__version__, "devices": len(devices)}))


if __name__ == "__main__":
    main()
