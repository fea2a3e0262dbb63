"""Step-time benchmark (issue 11): seconds per training step of one GPT, side by side in one
run, on CPU eager, on the spmd device (1 device; 8 and 64 devices data parallel, FSDP, 2-D
and Megatron tensor parallel), against 8 gloo DistributedDataParallel processes and JAX with 8
host devices; plus a
matmul-bound size on 8-device data parallel as a fraction of the host's fp32 matmul peak.

Model: benchmarks/bench_model.py's GPT (4 layers, d=128, 4 heads, seq 64, vocab 256), global
batch 64, Adam (lr 1e-3). Every row starts from the same initialization (torch.manual_seed(0))
and reads the same token batches, so each row's first losses are checked against CPU eager
(a wrong configuration cannot produce a fast number). Time per step: from the host batch to
the step's loss on the host (transfer, forward, backward, optimizer, mark_step, loss.item());
median of --steps steps after --warmup warm-up steps (the first compiles).

Rows, each in its own process (device counts and thread settings do not leak), run --rounds
times in turn (a shared host's slow phases then hit every row alike): a row's s/step is the
median of its rounds' medians, a ratio the median of the rounds' ratios. CPU eager runs before
the first spmd row and again after each one; an spmd row's ratio to eager divides by the mean
of the two eager runs around it (this host's speed drifts by tens of percent over a minute, so
a ratio to an eager run minutes away mostly measured the drift). The eager row's s/step is the
median of all its runs.
  - CPU eager and every spmd row: torch.set_num_threads(--threads, default: this process's
    cores); spmd rows set SPMD_NUM_DEVICES and SPMD_NUM_THREADS.
  - gloo DDP: 8 processes on 127.0.0.1, 1 intra-op thread and an eighth of the batch each; rank 0's median,
    with a barrier before each step; first losses are the all-reduced means (warm-up steps).
  - JAX: benchmarks/step_time_jax.py in a throw-away venv (--jax-venv, created with the
    python3 first on PATH and `pip install jax` when it has no jax; never a dependency of this
    project), XLA_FLAGS=--xla_force_host_platform_device_count=8, batch sharded with
    NamedSharding, parameters replicated, Adam written out. If jax cannot be installed the row
    says why.
  - matmul-bound: GPT d=1024, 2 layers, 8 heads, seq 64, batch 16 on 8-device data parallel.
    Model FLOPs per step = 6 * N * T + 12 * L * d * S * T (N: parameters without the
    embedding tables, T = batch * seq tokens, L layers, S seq; the second term is attention's
    QK^T and AV, forward and backward, counted over the whole S x S square as in PaLM's MFU),
    divided by the step time and by the host's fp32 matmul peak (best of several
    torch.mm(2048 x 2048, 2048 x 2048), same threads, same process, measured before and
    after the training steps). The same model on CPU eager is measured too, as the reference.

    PYTHONPATH=. .venv/bin/python benchmarks/step_time.py [--steps 7 --warmup 3] [--write | --out FILE]
    PYTHONPATH=. .venv/bin/python benchmarks/step_time.py --quick --skip-jax --skip-gloo --rounds 1   # smoke
"""
import argparse
import dataclasses
import datetime
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_model import GPT, GPTConfig, sharding_plan, spmd_train_step  # noqa: E402

CFG = GPTConfig(layers=4, dim=128, heads=4, seq=64, vocab=256, batch=64)
BIG_CFG = GPTConfig(layers=2, dim=1024, heads=8, seq=64, vocab=256, batch=16)
QUICK_CFG = GPTConfig(layers=2, dim=32, heads=2, seq=16, vocab=64, batch=16)
QUICK_BIG_CFG = GPTConfig(layers=1, dim=64, heads=2, seq=16, vocab=64, batch=16)
PEAK_N, QUICK_PEAK_N = 2048, 256
GLOO_PROCS = 8
JAX_VENV = "/tmp/spmd-bench-jax-venv"
SECTION = "Step time: emulated devices against CPU eager, gloo DDP and JAX (issue 11)"

# (key, label, child strategy, devices); the gloo and JAX rows are added after these.
SPMD_ROWS = (("spmd1", "spmd, 1 device", "single", 1),) + tuple(
    (f"{key}{n}", f"spmd, {n} devices, {what}", key, n)
    for n in (8, 64)
    for key, what in (
        ("dp", f"data parallel, mesh ({n},)"),
        ("fsdp", f"FSDP (params dim 0 and batch on 'fsdp'), mesh ({n},)"),
        ("2d", f"2-D: batch on 'data', Megatron on 'model', mesh ({n // 2}, 2)"),
        ("megatron", f"Megatron tensor parallel over all devices, mesh ({n},)"),
    ))


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def make_model(cfg: GPTConfig):
    import torch
    torch.manual_seed(0)
    return GPT(cfg)


def make_tokens(cfg: GPTConfig, n: int):
    """The token batches of steps 0..n-1, [n, batch, seq + 1] (inputs and shifted targets)."""
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, cfg.vocab, (n, cfg.batch, cfg.seq + 1), generator=g)


def timed_loop(step, tokens, warmup: int) -> dict:
    """Runs step(tokens[i]) -> loss (a float) for every i; times the steps after warm-up."""
    times, losses = [], []
    for i in range(tokens.shape[0]):
        start = time.perf_counter()
        losses.append(step(tokens[i]))
        times.append(time.perf_counter() - start)
    timed = times[warmup:]
    return {"median_s": statistics.median(timed), "times": timed, "losses": losses}


# ---------------------------------------------------------------- children (one per row) ---

def child_eager(cfg: GPTConfig, warmup: int, steps: int, threads: int, jax_npz: str) -> dict:
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    model = make_model(cfg)
    tokens = make_tokens(cfg, warmup + steps)
    if jax_npz:  # the JAX row starts from these parameters and reads these batches
        arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        np.savez(jax_npz, __tokens__=tokens.numpy(), **arrays)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(tok):
        loss = model.loss(tok[:, :-1], tok[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    out = timed_loop(step, tokens, warmup)
    out["threads"] = torch.get_num_threads()
    return out


def _spmd_setup(strategy: str, devices: int, model):
    """Annotates the parameters; returns the mesh axis the batch is sharded on (or None) and
    the mesh."""
    import numpy as np
    import torch_spmd.distributed.spmd as xs
    if strategy == "single":
        return None, None
    if strategy == "dp":
        mesh, plan, batch_axis = xs.Mesh(np.arange(devices), (devices,), ("data",)), {}, "data"
    elif strategy == "fsdp":
        # benchmarks/training.py's FSDP plan: every parameter's dim 0 over 'fsdp'.
        mesh = xs.Mesh(np.arange(devices), (devices,), ("fsdp",))
        plan, batch_axis = sharding_plan("fsdp", model), "fsdp"
    elif strategy == "2d":
        # Megatron on 'model': qkv / fc1 column parallel, proj / fc2 row parallel; rest replicated.
        mesh = xs.Mesh(np.arange(devices), (devices // 2, 2), ("data", "model"))
        plan, batch_axis = sharding_plan("megatron", model), "data"
    elif strategy == "megatron":
        # Megatron over every device on 'model'; the batch replicated (attention's 4 heads do
        # not split 64 ways: it runs replicated between the column- and row-parallel layers).
        mesh = xs.Mesh(np.arange(devices), (devices,), ("model",))
        plan, batch_axis = sharding_plan("megatron", model), None
    else:
        raise ValueError(strategy)
    for name, p in model.named_parameters():
        if name in plan:
            xs.mark_sharding(p, mesh, plan[name])
    return batch_axis, mesh


def _spmd_train(cfg: GPTConfig, strategy: str, devices: int, tokens, warmup: int) -> dict:
    import torch
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    if xr.global_runtime_device_count() != devices:
        xr.configure_devices(devices)
    dev = torch_spmd.device()
    model = make_model(cfg).to(dev)
    batch_axis, mesh = _spmd_setup(strategy, devices, model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(tok):
        return spmd_train_step(model, opt, tok, mesh, batch_axis).item()

    out = timed_loop(step, tokens, warmup)
    stats = torch_spmd.debug.last_step_stats()
    out.update(threads=torch.get_num_threads(), collectives=len(stats["collectives"]),
               fallbacks=sorted(stats.get("replicated_fallback_ops", {}) or {}),
               params=sum(p.numel() for p in model.parameters()))
    return out


def child_spmd(cfg: GPTConfig, strategy: str, devices: int, warmup: int, steps: int,
               threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    return _spmd_train(cfg, strategy, devices, make_tokens(cfg, warmup + steps), warmup)


def host_matmul_peak(n: int, repeats: int = 5) -> float:
    """fp32 FLOP/s of torch.mm(n x n, n x n) on this host, best of `repeats` (current threads)."""
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    reps = max(1, int(2 * 2048 ** 3 // (2 * n ** 3)))   # ~17 GFLOP per timing at any n
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        best = max(best, reps * 2 * n ** 3 / (time.perf_counter() - start))
    return best


def model_flops(cfg: GPTConfig, params_no_embedding: int) -> float:
    """Model FLOPs of one training step: 6 * N * T + 12 * L * d * S * T (see the docstring)."""
    tokens = cfg.batch * cfg.seq
    return 6 * params_no_embedding * tokens + 12 * cfg.layers * cfg.dim * cfg.seq * tokens


def child_matmul(cfg: GPTConfig, warmup: int, steps: int, threads: int, peak_n: int,
                 strategy: str) -> dict:
    """The matmul-bound GPT on 8-device data parallel (strategy 'dp') or on CPU eager
    ('eager', the reference), with the host's matmul peak measured in the same process."""
    import torch
    torch.set_num_threads(threads)
    peak = host_matmul_peak(peak_n)
    tokens = make_tokens(cfg, warmup + steps)
    ref = make_model(cfg)
    with torch.no_grad():
        eager_first_loss = ref.loss(tokens[0][:, :-1], tokens[0][:, 1:]).item()
    n_no_emb = sum(p.numel() for name, p in ref.named_parameters()
                   if not name.startswith(("tok.", "pos.")))
    del ref
    if strategy == "eager":
        out = child_eager(cfg, warmup, steps, threads, "")
    else:
        out = _spmd_train(cfg, "dp", 8, tokens, warmup)
    # A shared host's speed drifts: the peak is the best of a measurement before and after.
    peak = max(peak, host_matmul_peak(peak_n))
    flops = model_flops(cfg, n_no_emb)
    out.update(peak_flops=peak, peak_n=peak_n, model_flops=flops, params_no_embedding=n_no_emb,
               achieved_flops=flops / out["median_s"], fraction=flops / out["median_s"] / peak,
               eager_losses=[eager_first_loss])
    return out


def _gloo_worker(rank: int, world: int, port: int, cfg_json: str, warmup: int, steps: int,
                 out_path: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                           world_size=world)
    cfg = GPTConfig(**json.loads(cfg_json))
    per = cfg.batch // world
    tokens = make_tokens(cfg, warmup + steps)[:, rank * per:(rank + 1) * per]
    model = DDP(make_model(cfg))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times, losses = [], []
    for i in range(warmup + steps):
        tok = tokens[i]
        dist.barrier()
        start = time.perf_counter()
        logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        times.append(time.perf_counter() - start)
        if i < warmup:  # the global mean loss, for the check against eager (not timed)
            t = torch.tensor([value])
            dist.all_reduce(t)
            losses.append(t.item() / world)
    dist.barrier()
    if rank == 0:
        timed = times[warmup:]
        with open(out_path, "w") as f:
            json.dump({"median_s": statistics.median(timed), "times": timed, "losses": losses,
                       "threads": torch.get_num_threads(), "processes": world}, f)
    dist.destroy_process_group()


def child_gloo(cfg: GPTConfig, warmup: int, steps: int) -> dict:
    import torch.multiprocessing as mp
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "rank0.json")
        mp.spawn(_gloo_worker, nprocs=GLOO_PROCS, join=True,
                 args=(GLOO_PROCS, port, json.dumps(dataclasses.asdict(cfg)), warmup, steps,
                       out_path))
        with open(out_path) as f:
            return json.load(f)


# ------------------------------------------------------------------------------- parent ---

def run_eager(args, tag: str, threads_env: dict, npz: str) -> dict:
    """One CPU eager run (writing the JAX row's parameters and batches to `npz` if given);
    exits when it fails, as every ratio depends on it."""
    print(f"{tag} CPU eager", file=sys.stderr)
    eager = run_child(args, "eager", threads_env, *([npz] if npz else []))
    if "error" in eager:
        raise SystemExit(f"CPU eager row failed: {eager['error']}\n{eager['stderr']}")
    return eager


def run_child(args, kind: str, extra_env: dict, *child_args) -> dict:
    """Runs one row in a fresh interpreter; returns its JSON, or {"error": ...}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, *map(str, child_args),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    if args.quick:
        cmd.append("--quick")
    env = dict(os.environ, **extra_env)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:]
        return {"error": f"exit {proc.returncode}: {tail[0] if tail else '(no stderr)'}",
                "stderr": proc.stderr}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def jax_python(venv: str) -> tuple:
    """(python of a venv that imports jax, None) or (None, reason). Creates the venv and
    installs jax into it when needed."""
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import jax; print(jax.__version__)"]
    if os.path.exists(py) and subprocess.run(probe, capture_output=True).returncode == 0:
        return py, None
    base = shutil.which("python3")
    if base is None:
        return None, "no python3 on PATH to create its venv with"
    if not os.path.exists(py):
        made = subprocess.run([base, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            return None, f"`{base} -m venv {venv}` failed: {made.stderr.strip()[-200:]}"
    print(f"[step_time] installing jax into {venv} (pip install jax) ...", file=sys.stderr)
    try:
        pip = subprocess.run([py, "-m", "pip", "install", "--quiet", "jax"], capture_output=True,
                             text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "pip install jax timed out (30 min)"
    if pip.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        reachable = "reachable"
        try:
            import urllib.request
            urllib.request.urlopen("https://pypi.org/simple/jax/", timeout=10).close()
        except Exception as e:  # noqa: BLE001  (the reason goes into the table)
            reachable = f"not reachable ({type(e).__name__})"
        lines = [x for x in pip.stderr.strip().splitlines() if x.strip()]
        return None, (f"pip install jax failed (PyPI {reachable}): "
                      f"{lines[-1] if lines else 'exit %d' % pip.returncode}")
    return py, None


def run_jax(args, cfg: GPTConfig, npz: str) -> dict:
    py, reason = jax_python(args.jax_venv)
    if py is None:
        return {"error": f"JAX unavailable: {reason}"}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    cmd = [py, os.path.join(HERE, "step_time_jax.py"), "--data", npz,
           "--cfg", json.dumps(dataclasses.asdict(cfg)), "--warmup", str(args.warmup),
           "--steps", str(args.steps), "--devices", "8"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:]
        return {"error": f"JAX run failed: {tail[0] if tail else proc.returncode}",
                "stderr": proc.stderr}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_losses(row: dict, reference: list, count: int, rtol: float) -> None:
    """Sets row['check'] to 'ok' or 'FAILED', comparing the first `count` losses."""
    if "error" in row:
        return
    got = row["losses"][:count]
    want = reference[:len(got)]
    if not got:
        row["check"], row["check_ok"] = "no losses", False
        return
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, want))
    row["check_ok"] = worst <= rtol
    row["check"] = (f"{'ok' if row['check_ok'] else 'FAILED'} ({len(got)} step"
                    f"{'s' if len(got) > 1 else ''}, rel. diff {worst:.1e})")


def ratio(row: dict, ref: dict, adjacent: bool = False) -> str:
    """The median over rounds of row / ref, each round's pair measured back to back; with
    `adjacent`, ref (CPU eager) is the mean of the eager runs right before and right after
    the row's, where the row has them."""
    if "error" in row or ref is None or "error" in ref:
        return "n/a"
    refs = row["eager_around_rounds"] if adjacent and "eager_around_rounds" in row else ref["rounds"]
    pairs = [a / b for a, b in zip(row["rounds"], refs)]
    return f"{statistics.median(pairs):.2f}x"


def merge_rounds(results: list) -> dict:
    """One row from its rounds: the first round's record (losses, counts) with median_s the
    median of the rounds' medians and `rounds` every round's median."""
    if any("error" in r for r in results):
        return next(r for r in results if "error" in r)
    row = dict(results[0])
    row["rounds"] = [r["median_s"] for r in results]
    row["median_s"] = statistics.median(row["rounds"])
    if all("eager_around_s" in r for r in results):
        row["eager_around_rounds"] = [r["eager_around_s"] for r in results]
    if "fraction" in row:
        row["fraction"] = statistics.median(r["fraction"] for r in results)
        row["achieved_flops"] = statistics.median(r["achieved_flops"] for r in results)
        row["peak_flops"] = statistics.median(r["peak_flops"] for r in results)
    return row


def render(args, rows: list, matmul: dict, cfg: GPTConfig, big: GPTConfig,
           matmul_eager: dict = None) -> str:
    by_key = {key: r for key, _, r in rows}
    eager, gloo, jax = by_key.get("eager"), by_key.get("gloo"), by_key.get("jax")
    lines = ["| config | s/step | vs eager | vs gloo DDP | vs JAX | loss vs eager |",
             "|---|---:|---:|---:|---:|---|"]
    for key, label, r in rows:
        if "error" in r:
            error = r["error"].replace("|", "/")
            error = error if len(error) <= 200 else error[:197] + "..."
            lines.append(f"| {label} | {error} | n/a | n/a | n/a | n/a |")
            continue
        lines.append(f"| {label} | {r['median_s']:.4f} | {ratio(r, eager, adjacent=True)} | {ratio(r, gloo)} | "
                     f"{ratio(r, jax)} | {r.get('check', 'reference')} |")
    out = "\n".join(lines)
    if matmul is not None:
        if "error" in matmul:
            out += f"\n\nMatmul-bound ({_cfg_text(big)}, spmd 8-device data parallel): {matmul['error']}"
        else:
            out += (f"\n\nMatmul-bound ({_cfg_text(big)}, spmd 8-device data parallel): "
                    f"{matmul['median_s']:.3f} s/step, {matmul['model_flops'] / 1e9:.1f} model "
                    f"GFLOP/step = {matmul['achieved_flops'] / 1e9:.2f} GFLOP/s = "
                    f"**{matmul['fraction']:.3f}** of the host's fp32 matmul peak "
                    f"({matmul['peak_flops'] / 1e9:.2f} GFLOP/s, torch.mm {matmul['peak_n']}^3, "
                    f"{matmul['threads']} threads); loss vs eager {matmul.get('check', 'n/a')}.")
            if matmul_eager is not None and "error" not in matmul_eager:
                out += (f" CPU eager on the same model: {matmul_eager['median_s']:.3f} s/step = "
                        f"{matmul_eager['fraction']:.3f} of peak; spmd / eager "
                        f"{ratio(matmul, matmul_eager)}.")
    return out


def _cfg_text(cfg: GPTConfig) -> str:
    return (f"GPT {cfg.layers} layers, d={cfg.dim}, {cfg.heads} heads, seq {cfg.seq}, "
            f"vocab {cfg.vocab}, batch {cfg.batch}")


def section_body(args, table: str, cfg: GPTConfig, rows: list) -> str:
    import torch
    jax_row = next((r for key, _, r in rows if key == "jax"), None)
    jax_text = (f", jax {jax_row['jax_version']}" if jax_row and "jax_version" in jax_row else "")
    return (f"`benchmarks/step_time.py`{' --quick' if args.quick else ''}: {_cfg_text(cfg)}, Adam; "
            f"seconds per training step (host batch to loss on the host), median of {args.steps} "
            f"steps after {args.warmup} warm-up steps, in each of {args.rounds} rounds that run "
            "every row in turn (s/step: the median over rounds; \"vs X\": the median of the "
            "rounds' ratios; an spmd row's \"vs eager\" divides by the mean of the CPU eager "
            "runs right before and right after it, seconds apart), side by side in one run on "
            f"{cores()} cores ({datetime.date.today().isoformat()}, torch {torch.__version__}"
            f"{jax_text}). CPU eager and spmd rows use {args.threads} intra-op threads; gloo DDP "
            f"is {GLOO_PROCS} processes x 1 thread x batch {cfg.batch // GLOO_PROCS} (rank 0's "
            "median, a barrier before each step); JAX runs the same GPT with 8 host devices, "
            "batch sharded by NamedSharding, parameters replicated. \"vs X\" = this row's "
            "s/step / X's (below 1.00x: faster than X). Every row starts from the same "
            "parameters and reads the same batches; its first losses are checked against CPU "
            "eager. Matmul-bound: model FLOPs = 6·N·T + 12·L·d·S·T (N parameters without the "
            "embeddings, T tokens per step, S seq) per second, over the host's fp32 torch.mm "
            "peak measured in the same run.\n\n" + table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=7, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps (>= 1)")
    parser.add_argument("--threads", type=int, default=cores(),
                        help="intra-op threads of the eager and spmd rows (default: cores)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="every row runs this many times, the rows interleaved (a slow "
                             "phase of a shared host hits them alike); a row's s/step is the "
                             "median of its rounds, a ratio the median of its rounds' ratios")
    parser.add_argument("--quick", action="store_true", help="tiny models: a smoke test")
    parser.add_argument("--skip-gloo", action="store_true")
    parser.add_argument("--skip-jax", action="store_true")
    parser.add_argument("--skip-matmul", action="store_true")
    parser.add_argument("--jax-venv", default=JAX_VENV, help="throw-away venv with jax")
    parser.add_argument("--loss-rtol", type=float, default=2e-3,
                        help="relative tolerance of the loss check against CPU eager")
    parser.add_argument("--out", help="write the section (markdown) into FILE: replaces this "
                        "benchmark's section if FILE has it, else appends")
    parser.add_argument("--write", action="store_true", help="--out docs/benchmarks.md")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be >= 1")
    cfg, big = (QUICK_CFG, QUICK_BIG_CFG) if args.quick else (CFG, BIG_CFG)

    if args.child:
        kind = args.child[0]
        if kind == "eager":
            result = child_eager(cfg, args.warmup, args.steps, args.threads,
                                 args.child[1] if len(args.child) > 1 else "")
        elif kind == "spmd":
            result = child_spmd(cfg, args.child[1], int(args.child[2]), args.warmup, args.steps,
                                args.threads)
        elif kind == "matmul":
            result = child_matmul(big, args.warmup, args.steps, args.threads,
                                  QUICK_PEAK_N if args.quick else PEAK_N, args.child[1])
        elif kind == "gloo":
            result = child_gloo(cfg, args.warmup, args.steps)
        else:
            raise SystemExit(f"unknown child {kind}")
        print(json.dumps(result))
        return

    threads_env = {"SPMD_NUM_THREADS": str(args.threads)}
    compared = min(2, args.warmup + args.steps)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    labels = {"eager": None}
    runs = {}  # key -> one result per round
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "params_and_tokens.npz") if not args.skip_jax else ""
        for rnd in range(args.rounds):
            tag = f"[step_time] round {rnd + 1}/{args.rounds}:"
            # CPU eager runs before the first spmd row and after each one: a row's "vs eager"
            # divides by the mean of the eager runs right around it (seconds apart, where the
            # host's speed drifts by tens of percent over minutes).
            before = run_eager(args, tag, threads_env, npz if rnd == 0 else "")
            labels["eager"] = f"CPU eager (torch, {before['threads']} threads)"
            runs.setdefault("eager", []).append(before)
            for key, label, strategy, devices in SPMD_ROWS:
                print(f"{tag} {label}", file=sys.stderr)
                labels[key] = label
                row = run_child(args, "spmd", dict(threads_env, SPMD_NUM_DEVICES=str(devices)),
                                strategy, devices)
                after = run_eager(args, tag, threads_env, "")
                row["eager_around_s"] = (before["median_s"] + after["median_s"]) / 2
                runs.setdefault(key, []).append(row)
                runs.setdefault("eager_all", []).append(after)
                before = after
            if not args.skip_gloo:
                print(f"{tag} gloo DDP", file=sys.stderr)
                labels["gloo"] = (f"gloo DDP, {GLOO_PROCS} processes x 1 thread, batch "
                                  f"{cfg.batch // GLOO_PROCS} each")
                runs.setdefault("gloo", []).append(
                    run_child(args, "gloo", {"OMP_NUM_THREADS": "1", "SPMD_NUM_THREADS": "1"}))
            if not args.skip_jax:
                print(f"{tag} JAX", file=sys.stderr)
                labels["jax"] = "JAX CPU, 8 host devices, batch sharded (NamedSharding)"
                runs.setdefault("jax", []).append(run_jax(args, cfg, npz))
            if not args.skip_matmul:
                print(f"{tag} matmul-bound (spmd 8-device data parallel, CPU eager)",
                      file=sys.stderr)
                runs.setdefault("matmul", []).append(
                    run_child(args, "matmul", dict(threads_env, SPMD_NUM_DEVICES="8"), "dp"))
                runs.setdefault("matmul_eager", []).append(
                    run_child(args, "matmul", threads_env, "eager"))
    eager = merge_rounds(runs["eager"])
    # The eager row's s/step: the median over every eager run (each round's first decides the
    # ratios of the gloo and JAX rows, measured in the same round).
    eager["median_s"] = statistics.median(r["median_s"] for r in runs["eager"] + runs["eager_all"])
    rows = [("eager", labels["eager"], eager)]
    for key in [k for k in runs if k not in ("eager", "eager_all", "matmul", "matmul_eager")]:
        r = merge_rounds(runs[key])
        check_losses(r, eager["losses"], compared, args.loss_rtol)
        rows.append((key, labels[key], r))
    matmul = matmul_eager = None
    if not args.skip_matmul:
        matmul = merge_rounds(runs["matmul"])
        matmul_eager = merge_rounds(runs["matmul_eager"])
        if "error" not in matmul:
            check_losses(matmul, matmul["eager_losses"], 1, args.loss_rtol)

    table = render(args, rows, matmul, cfg, big, matmul_eager)
    print(table)
    for key, label, r in rows:
        if "stderr" in r and key != "jax":
            print(f"\n[step_time] {label} failed:\n{r['stderr'][-3000:]}", file=sys.stderr)
    out = os.path.join(ROOT, "docs", "benchmarks.md") if args.write else args.out
    if out:
        from common.docs import write_section
        write_section(out, SECTION, section_body(args, table, cfg, rows))
        print(f"[step_time] wrote section '{SECTION}' to {out}", file=sys.stderr)
    failed = [label for key, label, r in rows + [("matmul", "matmul-bound", matmul or {})]
              if r.get("check_ok") is False or ("error" in r and key != "jax")]
    if failed:
        raise SystemExit("[step_time] failed (error or loss check): " + "; ".join(failed))


if __name__ == "__main__":
    main()
