"""Auto-sharding benchmark (issue 28): ``torch_spmd.plan.auto_shard``'s layout against the best
hand-written one, per case, side by side in one run.

Per case (model, device count, hardware preset, memory budget), the hand-written layouts are
planned on every (data, model) factorisation of the devices (``plan_layouts``):
data parallel (the batch over every device), FSDP (every parameter's dim 0 over every device,
as FSDPv2), Megatron tensor parallelism (column-parallel q/k/v/fc, row-parallel out/proj, a
vocab-parallel embedding, the batch over 'data') and FSDP x TP (the same with the parameters'
other dim over 'data', with the embedding vocabulary-parallel or only FSDP-sharded, as
benchmarks/plan.py's 70B layout); for ResNet-50, spatial partitioning instead of TP. Then ``auto_shard`` searches, knowing none of them, within the time
limit. Reported: the best hand layout's predicted step and peak, auto_shard's, their ratio (or
"no hand layout fits" where none does and auto_shard's does), the solve time, the layouts
planned and when the returned layout was found. Every case is planned in a fresh process.

    PYTHONPATH=. python benchmarks/auto_shard.py [--write] [--only NAME]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

GIB = 2**30
# name: (model, devices, hardware, budget bytes or None, time limit s)
CASES = {
    "gpt2-8-a100": ("gpt2", 8, "a100-80gb", None, 9),
    "gpt2-64-v5p": ("gpt2", 64, "tpu-v5p", None, 9),
    # the same search left to run until its descent converges: what the limit costs
    "gpt2-64-v5p-120s": ("gpt2", 64, "tpu-v5p", None, 120),
    "gpt2-64-v5p-2GiB": ("gpt2", 64, "tpu-v5p", 2 * GIB, 9),
    "llama8b-64-v5p": ("llama8b", 64, "tpu-v5p", None, 60),
    "llama8b-64-v5p-24GiB": ("llama8b", 64, "tpu-v5p", 24 * GIB, 60),
    "llama8b-256-h100": ("llama8b", 256, "h100-80gb", None, 60),
    "llama70b-2048-v5p": ("llama70b", 2048, "tpu-v5p", None, 60),
    # tighter than every hand layout's peak: the search must find a layout that fits
    "llama70b-2048-v5p-56GiB": ("llama70b", 2048, "tpu-v5p", 56 * GIB, 60),
    "resnet50-8-v4": ("resnet50", 8, "tpu-v4", None, 60),
    "mixtral-64-v5p": ("mixtral", 64, "tpu-v5p", None, 60),
}


def _model(kind):
    import torch
    from plan_models import GPT2Config, GPT2LMHeadModel, Llama, LlamaConfig, ResNet50
    if kind == "resnet50":  # 128 images per chip, fp32, SGD with momentum
        return ResNet50, 1024, None, torch.float32
    if kind == "gpt2":
        cfg = GPT2Config(batch=64, seq=1024)
        return (lambda: GPT2LMHeadModel(cfg)), cfg.batch, cfg.seq, torch.float32
    if kind == "mixtral":  # Mixtral 8x7B's shape: 8 experts, top 2, 32 layers
        cfg = LlamaConfig(layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                          batch=64, seq=2048, experts=8, top_k=2)
        return (lambda: Llama(cfg).to(torch.bfloat16)), cfg.batch, cfg.seq, torch.bfloat16
    if kind == "llama70b":  # benchmarks/plan.py's 70B: batch 256 x 4096
        cfg = LlamaConfig()
        return (lambda: Llama(cfg).to(torch.bfloat16)), cfg.batch, cfg.seq, torch.bfloat16
    cfg = LlamaConfig(layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                      batch=64, seq=2048)
    return (lambda: Llama(cfg).to(torch.bfloat16)), cfg.batch, cfg.seq, torch.bfloat16


COLUMN = ("c_attn.", "c_fc.", "wq.", "wk.", "wv.", "w1.", "w3.", "output.")
ROW = ("c_proj.", "mlp_proj.", "wo.", "w2.")


def _hand_spec(layout, name, p):
    """A hand-written layout's spec for parameter `name` (GPT-2's Conv1D weights are [in, out],
    Llama's Linear weights [out, in])."""
    every = ("data", "model")
    if layout == "dp":
        return (None,) * p.dim()
    if p.dim() == 3:  # a mixture's experts, [experts, in, out]: w1/w3 [E, d, ffn], w2 [E, ffn, d]
        hidden = 1 if name.endswith("w2") else 2
        spec = [None] * 3
        spec[3 - hidden] = every if layout == "fsdp" else "data" if layout.startswith("fsdp-") \
            else None
        if layout.endswith("ep"):  # expert parallel: the experts over 'model'
            spec[0] = "model"
        elif layout != "fsdp":  # Megatron inside every expert
            spec[hidden] = "model"
        return tuple(spec)
    if layout == "fsdp":
        return (every,) + (None,) * (p.dim() - 1)
    fsdp = "data" if layout.startswith("fsdp-tp") else None
    conv1d = name.startswith("h.")  # GPT-2's blocks
    out_dim, in_dim = (1, 0) if conv1d else (0, 1)
    spec = [None] * p.dim()
    if p.dim() == 2:
        if any(k in name for k in COLUMN):
            spec[out_dim], spec[in_dim] = "model", fsdp
        elif any(k in name for k in ROW):
            spec[in_dim], spec[out_dim] = "model", fsdp
        elif name in ("wte.weight", "tok_embeddings.weight"):
            if layout == "fsdp-tp-embedding-fsdp":  # benchmarks/plan.py's 70B layout
                spec[0] = fsdp
            else:  # vocab-parallel embedding
                spec[0], spec[1] = "model", fsdp
        else:
            spec[0] = fsdp
    elif any(k in name for k in COLUMN):  # a column-parallel layer's bias
        spec[0] = "model"
    return tuple(spec)


def run_case(name):
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    import torch
    torch.set_num_threads(1)
    from torch_spmd.plan import auto_shard, plan_layouts
    kind, n, hw, budget, limit = CASES[name]
    make, batch, seq, _ = _model(kind)

    import torch.nn.functional as F
    every = ("data", "model")
    if kind == "resnet50":
        def build():
            with torch.device("spmd"):
                model = make()
                x = torch.zeros(batch, 3, 224, 224)
                y = torch.zeros(batch, dtype=torch.long)
            return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), (x, y)

        def step(model, opt, x, y):
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()

        def inputs(batch_axes, h_axes=None):
            return [(batch_axes, None, h_axes, None), (batch_axes,)]
    else:
        def build():
            with torch.device("spmd"):
                model = make()
                idx = torch.zeros(batch, seq, dtype=torch.long)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-4), (idx,)

        def step(model, opt, idx):
            logits = model(idx)
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                            idx.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()

        def inputs(batch_axes, h_axes=None):
            return [(batch_axes, None)]

    layouts = {"dp": ((n, 1), every, lambda q, p: _hand_spec("dp", q, p), inputs(every)),
               "fsdp": ((n, 1), every, lambda q, p: _hand_spec("fsdp", q, p), inputs(every))}
    for m in (m for m in range(2, n + 1) if n % m == 0 and m <= 64):
        if kind == "resnet50":  # spatial partitioning: the images' rows over 'model'
            layouts[f"spatial {n // m}x{m}"] = (
                (n // m, m), every, lambda q, p: _hand_spec("dp", q, p), inputs("data", "model"))
            continue
        kinds = ("tp", "fsdp-tp", "fsdp-tp-embedding-fsdp")
        if kind == "mixtral" and m <= 8:  # expert parallelism, at most one expert per device
            kinds += ("ep", "fsdp-ep")
        for kind_ in kinds:
            layouts[f"{kind_} {n // m}x{m}"] = (
                (n // m, m), every, (lambda k: lambda q, p: _hand_spec(k, q, p))(kind_),
                inputs("data"))
    # auto_shard first, in the fresh process, as a user calls it (planning the hand layouts
    # first leaves a heap that slows its evaluations by a fifth)
    res = auto_shard(build, step, num_devices=n, hardware=hw, memory_budget=budget,
                     time_limit=limit)
    a = res.best
    t0 = time.perf_counter()
    hand = plan_layouts(build, step, n, layouts, hardware=hw, memory_budget=budget)
    hand_s = time.perf_counter() - t0
    from torch_spmd.plan.auto_shard import _rank
    planned = {k: v for k, v in hand.items() if v is not None}
    best_name = min(planned, key=lambda k: _rank(planned[k]))
    hb = planned[best_name]
    return dict(case=name, hand=best_name, hand_step=hb.predicted_step_seconds,
                hand_peak=hb.peak_bytes, hand_fits=hb.fits, hand_layouts=len(planned),
                hand_seconds=hand_s, auto_step=a.predicted_step_seconds, auto_peak=a.peak_bytes,
                auto_fits=a.fits, auto_mesh=list(a.mesh_shape), evaluations=res.evaluations,
                found_after=a.found_after, ilp=[_ilp_cell(r) for r in res.ilp],
                seconds=res.seconds, timed_out=res.timed_out, decisions=len(res.classes),
                lines=res.mark_sharding_lines())


def _ilp_cell(r):
    """One mesh shape's ILP for the table: its gap, solve time and its layout as planned."""
    if r.choice is None:
        return r.status if r.status.startswith("skipped") else \
            f"{'x'.join(map(str, r.mesh_shape))}: {r.status}"
    planned = "" if r.planned_step_seconds is None else \
        f" -> {r.planned_step_seconds * 1e3:.1f} ms{'' if r.planned_fits else ' (over)'}"
    return (f"{'x'.join(map(str, r.mesh_shape))}: gap {r.gap:.1%} in {r.seconds:.2f} s"
            f"{planned}")


def table(rows):
    out = ["| case | best hand layout | its step / peak | auto_shard step / peak (mesh) | "
           "auto / hand | solve s (layouts) | best found at s | ILP per shape: gap, solve s -> "
           "its layout planned |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        hfit = "" if r["hand_fits"] else " (over)"
        afit = "" if r["auto_fits"] else " (over)"
        ratio = f"{r['auto_step'] / r['hand_step']:.3f}" if r["hand_fits"] or not r["auto_fits"] \
            else "no hand layout fits"
        out.append(
            f"| {r['case']} | {r['hand']} | {r['hand_step'] * 1e3:.1f} ms / "
            f"{r['hand_peak'] / GIB:.1f} GiB{hfit} | {r['auto_step'] * 1e3:.1f} ms / "
            f"{r['auto_peak'] / GIB:.1f} GiB{afit} ({r['auto_mesh'][0]}x{r['auto_mesh'][1]}) | "
            f"{ratio} | {r['seconds']:.1f}{' (limit)' if r['timed_out'] else ''} "
            f"({r['evaluations']}) | {r['found_after']:.1f} | {'; '.join(r['ilp'])} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--only", help="one case")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # child process
    args = ap.parse_args()
    if args.case:
        print("RESULT " + json.dumps(run_case(args.case)))
        return
    rows = []
    for name in ([args.only] if args.only else CASES):
        env = dict(os.environ, PYTHONPATH=ROOT)
        out = subprocess.run([sys.executable, __file__, "--case", name], env=env,
                             capture_output=True, text=True)
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode or not line:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"case {name} failed")
        rows.append(json.loads(line[0][7:]))
        print(table(rows[-1:]), flush=True)
    text = table(rows)
    print(text)
    if args.write:
        from common.docs import write_section
        notes = (
            "Hand layouts: data parallel, FSDP (dim 0 over every device), Megatron TP and "
            "FSDP x TP (the embedding vocabulary-parallel, or FSDP-sharded as "
            "benchmarks/plan.py's 70B) on every (data, model) factorisation with a model axis of at most 64 "
            "(`_hand_spec`); their best is the one that fits with the lowest predicted step. "
            "auto_shard knows none of them and no parameter names: it finds the step's dim "
            "classes, seeds data parallelism and FSDP, and per mesh shape the batch over "
            "'data' with the parameter-only classes over 'model' (with and without FSDP; "
            "each kind swept by growing model axis until two shapes rank behind its best), "
            "solves the layout ILP (HiGHS) on the mesh shapes of its two best seeds and plans "
            "its solutions (the ILP's gap is of its own objective, no overlap: "
            "docs/auto_sharding.md), "
            "descends one decision at a time against the plan, and re-plans exactly up to 5 "
            "of its best layouts within 10% of the best (torch_spmd/plan/auto_shard.py). Both sides are planned exactly (fresh tensors "
            "marked, two steps, the second reported: bf16 Llama, fp32 GPT-2, AdamW). "
            "Solve time is the whole call (the exact re-planning is kept inside the "
            "limit); 'best found at' is when the search first planned the layout it returns. "
            "gpt2-64-v5p-120s is gpt2-64-v5p left to run until its descent converges; "
            "llama70b-2048-v5p-56GiB's budget is below every hand layout's peak. "
            "auto_shard runs first in each case's fresh process. GPT-2: 12 layers, d=768, "
            "batch 64 x 1024. Llama 8B: 32 layers, d=4096, GQA 8 KV heads, SwiGLU 14336, "
            "vocab 128256, batch 64 x 2048, attention written out (S x S scores held). "
            "Llama 70B: benchmarks/plan.py's (80 layers, d=8192, batch 256 x 4096). "
            "Mixtral: 8x7B's shape (32 layers, d=4096, 8 SwiGLU experts of 14336, top 2, "
            "vocab 32000, batch 64 x 2048), the experts as GShard/MaxText's dropping "
            "implementation writes them (groups of 1024 tokens, capacity factor 1.25, "
            "one-hot dispatch and combine einsums; benchmarks/plan_models.py's MoE); its "
            "hand layouts add expert parallelism (the experts over 'model', with or without "
            "FSDP over 'data'), and its FSDP shards the experts' 'd' or 'ffn' dim. "
            "ResNet-50: batch 1024 of 224 x 224 images, SGD with momentum; its hand layouts "
            "are data parallel, FSDP and spatial partitioning (the images' rows over 'model', "
            "the batch over 'data').")
        body = "`python benchmarks/auto_shard.py --write`\n\n" + text + "\n\n" + notes
        write_section(os.path.join(ROOT, "docs", "benchmarks.md"), "Auto-sharding (issue 28)",
                      body)
        write_section(os.path.join(ROOT, "docs", "auto_sharding.md"),
                      "Against hand-written layouts", body)


if __name__ == "__main__":
    main()
