"""Plan mode against published numbers (docs/benchmarks.md, "Plan mode").

Each study runs in its own process (a plan resizes the emulated device set) and prints one JSON
line; the parent prints a markdown table and, with --write, puts it into docs/benchmarks.md.

Studies:
- zero: ZeRO's model-state memory (Rajbhandari et al. 2020, Table 1): a 7.5B-parameter GPT with
  Adam in fp32 on 64 devices holds 16 bytes per parameter, 120 GB per device replicated and
  1.875 GB with FSDPv2 (ZeRO-3); the plan's resident bytes per device, and its planning time.
- mfu: the PyTorch/XLA SPMD blog's 39.75% MFU for a 4B GPT-2-style model on a TPU v4-16 with
  FSDP-style 1-D sharding: the plan's predicted MFU for the configuration below.
- peak2b: the blog's "unsharded 2B model peak memory footprint stands at 26GB" (HF GPT-2 layout)
  and how sharding the weights lowers it.
- resnet: the blog's ResNet-50 on a TPU v4-8: a per-device batch of 512 only with spatial
  partitioning (input sharded on its spatial dims), not with data parallelism.
- llama70b: a 70B Llama-style model, 2-D (fsdp x tensor) on 2048 devices: plan time and host
  memory.
- llama70b-pipeline: the same model with its 80 blocks as a 4-stage pipeline
  (torch_spmd.distributed.pipeline) x 64 fsdp x 8 tensor: plan time, bubble, per-stage peak.
"""
import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _setup():
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    import torch
    torch.set_num_threads(1)


def _train_step(model, idx, targets, opt, loss_fn):
    import torch_spmd.core.xla_model as xm
    loss = loss_fn(model, idx, targets)
    loss.backward()
    opt.step()
    del loss
    xm.mark_step()


def gpt_loss(model, idx, targets):
    import torch.nn.functional as F
    logits = model(idx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def study_zero(strategy: str) -> dict:
    _setup()
    import numpy as np
    import torch
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from torch_spmd.experimental.spmd_fully_sharded_data_parallel import \
        SpmdFullyShardedDataParallel as FSDPv2
    from bench_model import GPT, GPTConfig
    # d=4096, 36 layers: 7.25B in the blocks; input and output embeddings of a 30,080-token
    # vocabulary bring it to 7.50B.
    cfg = GPTConfig(layers=36, dim=4096, heads=32, seq=1024, vocab=30080, batch=64)
    t0 = time.perf_counter()
    with plan.Plan(num_devices=64, hardware="tpu-v4") as p:
        mesh = xs.Mesh(np.arange(64), (64,), ("fsdp",))
        with torch.device("spmd"):
            model = GPT(cfg)
        n = sum(q.numel() for q in model.parameters())
        if strategy == "fsdpv2":
            model = FSDPv2(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        xm.mark_step()
        idx = torch.zeros(cfg.batch, cfg.seq, dtype=torch.long, device="spmd")
        xs.mark_sharding(idx, mesh, ("fsdp", None))
        _train_step(model, idx, idx, opt, gpt_loss)
        r = p.report()
    return dict(study="zero", strategy=strategy, params=n,
                resident=r.resident_bytes_per_device[0], peak=r.peak_bytes_per_device[0],
                fits=r.fits, seconds=time.perf_counter() - t0,
                maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def study_mfu() -> dict:
    _setup()
    import numpy as np
    import torch
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from torch_spmd.experimental.spmd_fully_sharded_data_parallel import \
        SpmdFullyShardedDataParallel as FSDPv2
    from plan_models import GPT2Config, GPT2LMHeadModel
    # A 4B GPT-2: 36 layers of width 3072 (24 heads), HF layout, bf16, sequence 1024, global
    # batch 64 (4 per chip, the most that fits in 32 GiB without activation checkpointing),
    # FSDP-style 1-D sharding of every parameter over the 16 chips.
    cfg = GPT2Config(n_layer=36, n_embd=3072, n_head=24, batch=64, seq=1024)
    t0 = time.perf_counter()
    with plan.Plan(num_devices=16, hardware="tpu-v4") as p:
        mesh = xs.Mesh(np.arange(16), (16,), ("fsdp",))
        with torch.device("spmd"):
            model = GPT2LMHeadModel(cfg).to(torch.bfloat16)
        n = sum(q.numel() for q in model.parameters())
        model = FSDPv2(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        xm.mark_step()
        idx = torch.zeros(cfg.batch, cfg.seq, dtype=torch.long, device="spmd")
        xs.mark_sharding(idx, mesh, ("fsdp", None))
        _train_step(model, idx, idx, opt, gpt_loss)
        r = p.report()
    tokens = cfg.batch * cfg.seq
    # The usual model-FLOPs count (6 per parameter per token plus attention), for comparison
    # with the plan's own count of every op.
    six_nd = 6 * n * tokens + 12 * cfg.n_layer * cfg.n_embd * cfg.seq * tokens
    return dict(study="mfu", params=n, mfu=r.mfu, step=r.predicted_step_seconds,
                overlapped=r.overlapped_step_seconds, compute=r.compute_seconds,
                comm=r.communication_seconds, model_flops=r.model_flops, six_nd=six_nd,
                mfu_6nd=six_nd / (r.predicted_step_seconds * 16 * r.hardware["peak_flops_bf16"]),
                fits=r.fits, peak=r.peak_bytes_per_device[0], seconds=time.perf_counter() - t0)


def study_peak2b(strategy: str) -> dict:
    _setup()
    import numpy as np
    import torch
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from plan_models import GPT2Config, GPT2LMHeadModel
    # HF GPT-2 layout, 2.1B parameters: 40 layers of width 2048 (16 heads), fp32 weights, plain
    # SGD (8 bytes of model state per parameter: weights and gradients; the blog does not name
    # its optimizer), sequence 1024, batch 2 per chip.
    cfg = GPT2Config(n_layer=40, n_embd=2048, n_head=16, batch=16, seq=1024)
    with plan.Plan(num_devices=8, hardware="tpu-v4") as p:
        mesh = xs.Mesh(np.arange(8), (8,), ("model",)) if strategy != "dp" else \
            xs.Mesh(np.arange(8), (8,), ("data",))
        with torch.device("spmd"):
            model = GPT2LMHeadModel(cfg)
        n = sum(q.numel() for q in model.parameters())
        if strategy == "sharded":  # weights sharded on their larger dim over 8 chips
            for q in model.parameters():
                dim = max(range(q.dim()), key=lambda d: q.shape[d])
                xs.mark_sharding(q, mesh, tuple("model" if d == dim else None
                                                for d in range(q.dim())))
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        xm.mark_step()
        idx = torch.zeros(cfg.batch, cfg.seq, dtype=torch.long, device="spmd")
        xs.mark_sharding(idx, mesh, (mesh.axis_names[0], None))
        _train_step(model, idx, idx, opt, gpt_loss)
        _train_step(model, idx, idx, opt, gpt_loss)  # steady state: optimizer state exists
        r = p.report()
    return dict(study="peak2b", strategy=strategy, params=n, peak=r.peak_bytes_per_device[0],
                resident=r.resident_bytes_per_device[0], fits=r.fits, peak_op=r.peak_op)


def study_resnet(strategy: str) -> dict:
    _setup()
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from plan_models import ResNet50
    per_device = 512
    with plan.Plan(num_devices=8, hardware="tpu-v4") as p:
        with torch.device("spmd"):
            model = ResNet50()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xm.mark_step()
        if strategy == "data":  # 512 images per chip: a global batch of 4096, batch-sharded
            mesh = xs.Mesh(np.arange(8), (8, 1, 1), ("data", "h", "w"))
            x = torch.empty(per_device * 8, 3, 224, 224, device="spmd")
            xs.mark_sharding(x, mesh, ("data", None, None, None))
        else:  # 512 images seen by every chip, each holding 1/8 of every image (2 x 4 tiles)
            mesh = xs.Mesh(np.arange(8), (1, 2, 4), ("data", "h", "w"))
            x = torch.empty(per_device, 3, 224, 224, device="spmd")
            xs.mark_sharding(x, mesh, (None, None, "h", "w"))
        y = torch.zeros(x.shape[0], dtype=torch.long, device="spmd")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        del loss
        xm.mark_step()
        r = p.report()
    return dict(study="resnet", strategy=strategy, peak=r.peak_bytes_per_device[0], fits=r.fits,
                capacity=r.hardware["hbm_bytes"], peak_op=r.peak_op)


def _llama70b_spec(name: str, dims: int) -> tuple:
    """Megatron column/row-parallel over 'tensor', FSDP over 'fsdp'."""
    if name.endswith(("wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight")):
        return ("tensor", "fsdp")      # column-parallel: output features on 'tensor'
    if name.endswith(("wo.weight", "w2.weight")):
        return ("fsdp", "tensor")      # row-parallel: input features on 'tensor'
    return ("fsdp", None) if dims == 2 else ("fsdp",)


def study_llama70b(stages: int = 1, microbatches: int = 4) -> dict:
    _setup()
    import torch
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from plan_models import Llama, LlamaConfig
    from torch_spmd.distributed.pipeline import Pipeline
    cfg = LlamaConfig()
    t0 = time.perf_counter()
    shape, names = ((256, 8), ("fsdp", "tensor")) if stages == 1 else \
        ((stages, 256 // stages, 8), ("stage", "fsdp", "tensor"))
    with plan.Plan(num_devices=2048, hardware="tpu-v5p", mesh_shape=shape,
                   axis_names=names) as p:
        mesh = xs.get_global_mesh()
        with torch.device("spmd"):
            model = Llama(cfg).to(torch.bfloat16)
        n = sum(q.numel() for q in model.parameters())
        if stages > 1:
            model.layers = Pipeline(model.layers, mesh, "stage", num_microbatches=microbatches,
                                    activation_spec=("fsdp", None, None),
                                    param_spec=lambda name, s: _llama70b_spec(name, len(s)),
                                    checkpoint=True)
        for name, q in model.named_parameters():
            if not name.startswith("layers.stacked"):  # (the pipeline shards its own)
                xs.mark_sharding(q, mesh, _llama70b_spec(name, q.dim()))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        xm.mark_step()
        t1 = time.perf_counter()
        idx = torch.zeros(cfg.batch, cfg.seq, dtype=torch.long, device="spmd")
        xs.mark_sharding(idx, mesh, ("fsdp", None))
        _train_step(model, idx, idx, opt, gpt_loss)
        r = p.report()
    pipe = r.pipeline[0] if r.pipeline else {}
    return dict(study="llama70b" if stages == 1 else "llama70b-pipeline", params=n,
                seconds=time.perf_counter() - t0,
                step_seconds=time.perf_counter() - t1, mfu=r.mfu,
                predicted=r.predicted_step_seconds, peak=r.peak_bytes_per_device[0],
                resident=r.resident_bytes_per_device[0], fits=r.fits,
                maxrss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                collectives=sum(c["count"] for c in r.collectives),
                bubble=pipe.get("bubble_fraction"), bubble_formula=pipe.get("bubble_fraction_formula"),
                permutes=pipe.get("permutes"), permute_bytes=pipe.get("permute_bytes"))


NOTES = """How to read this table (configurations in `benchmarks/plan.py`):
- ZeRO: resident bytes after an Adam step (parameters, gradients, two moments, fp32) are exactly
  16 bytes per parameter, and 1/64 of that with FSDPv2, as Table 1 of the ZeRO paper says; the
  plan's planning time is the whole script (model build, initialisation step, training step).
- MFU: the blog gives the model size, chip count and strategy, not the batch or precision. We
  plan bf16 with AdamW at 4 sequences of 1024 tokens per chip, the largest batch whose plan fits
  32 GiB without activation checkpointing. The cost model overlaps the FSDP all-gathers with
  compute (critical path of the streams), fuses pointwise chains, prices views as free and
  uses tpu-v4's fitted matmul efficiency (0.76, on MaxText's runs, which XLA compiles without
  PyTorch/XLA's tracing): it predicts 58.9%, 19 points above the blog; what PyTorch/XLA's
  tracing and its own kernels cost beyond MaxText's compiled step is not in it. The blog's
  batch and sequence are unknown, so this row calibrates nothing.
- 2B peak: the blog gives neither optimizer nor batch. Our configuration (HF layout, fp32, plain
  SGD, batch 2 per chip) runs in recorded (eager) order; on the TPU preset its memory is XLA's
  (fused memory: a single-use elementwise value lives inside its reader's fusion), which holds
  27.9 GB (34.4 GB with every value held, as eager PyTorch would). The graph runs in whichever
  of the recorded and post-order holds fewer bytes at once, compared before partitioning, with
  global sizes. Sharding the weights over the 8 chips lowers the peak, as in the blog.
- ResNet-50: 512 images per chip with data parallelism is a global batch of 4096 in fp32 and does
  not fit a v4 chip's 32 GiB; with the spatial dims split 2 x 4 each chip holds an eighth of every
  one of 512 images and fits, the blog's verdict for both.
- Llama: 80 layers, d=8192, GQA with 8 KV heads, SwiGLU 28672, vocab 32000, bf16, AdamW, batch 256 x
  4096 tokens; Megatron column/row-parallel over 'tensor' (8) and FSDP over 'fsdp' (256).
  Pipelined: the same blocks stacked into 4 stages of 20 (`Pipeline`, activation checkpointing
  per iteration), the batch in 4 micro-batches of 64 sequences split over 'fsdp' (64): 7
  iterations, 3 of which are partly bubble. The bubble is measured on the plan (each
  iteration's planned time, forward and backward, times its idle stages' share), not assumed.
  With 64 chips per stage on 'fsdp', collective matmul windows each stage's weight gathers
  into rings of permutes (125,522 collectives in the step against 2,649 for the 2-D layout),
  which is what lengthens that plan (2.0 s before collective matmul); the shift between
  stages is its 14 permutes.
"""

STUDIES = {
    "zero-replicated": lambda: study_zero("replicated"),
    "zero-fsdpv2": lambda: study_zero("fsdpv2"),
    "mfu": study_mfu,
    "peak2b-unsharded": lambda: study_peak2b("unsharded"),
    "peak2b-sharded": lambda: study_peak2b("sharded"),
    "resnet-data": lambda: study_resnet("data"),
    "resnet-spatial": lambda: study_resnet("spatial"),
    "llama70b": study_llama70b,
    "llama70b-pipeline": lambda: study_llama70b(stages=4),
}


def run_child(name: str) -> dict:
    sys.path.insert(0, HERE)
    from common.children import run_json_child
    result = run_json_child(__file__, ["--child", name], ROOT)
    return dict(result, study=name) if "error" in result else result


def table(results: dict) -> str:
    gb = 1e9
    z_r, z_f = results.get("zero-replicated"), results.get("zero-fsdpv2")
    lines = ["| study | published | plan | ratio / verdict |", "|---|---|---|---|"]
    if z_r and "error" not in z_r:
        n = z_r["params"]
        lines.append(f"| ZeRO Table 1: {n / 1e9:.2f}B GPT, Adam fp32, 64 devices, replicated | "
                     f"16 B/param = {16 * n / gb:.1f} GB/device | {z_r['resident'] / gb:.2f} GB "
                     f"resident | {z_r['resident'] / (16 * n):.4f} |")
    if z_f and "error" not in z_f:
        n = z_f["params"]
        lines.append(f"| same, FSDPv2 (ZeRO-3) over 64 | {16 * n / 64 / gb:.3f} GB/device | "
                     f"{z_f['resident'] / gb:.3f} GB resident | {z_f['resident'] / (16 * n / 64):.4f} "
                     f"(planned in {z_f['seconds']:.1f} s, {z_f['maxrss'] / gb:.2f} GB host) |")
    m = results.get("mfu")
    if m and "error" not in m:
        lines.append(f"| 4B GPT-2 ({m['params'] / 1e9:.2f}B), TPU v4-16, FSDP 1-D | 39.75% MFU | "
                     f"{m['mfu'] * 100:.1f}% (6ND count: {m['mfu_6nd'] * 100:.1f}%), step "
                     f"{m['step']:.2f} s | gap {m['mfu'] * 100 - 39.75:+.1f} points |")
    p_u, p_s = results.get("peak2b-unsharded"), results.get("peak2b-sharded")
    if p_u and "error" not in p_u:
        lines.append(f"| 2B GPT-2 HF ({p_u['params'] / 1e9:.2f}B), unsharded, peak per chip | 26 GB | "
                     f"{p_u['peak'] / gb:.1f} GB | {p_u['peak'] / 26e9:.3f} |")
    if p_s and "error" not in p_s:
        lines.append(f"| same, weights sharded over 8 | lower | {p_s['peak'] / gb:.1f} GB | "
                     f"{'lower' if p_u and p_s['peak'] < p_u.get('peak', 0) else 'NOT lower'} |")
    for key, label in (("resnet-data", "ResNet-50, v4-8, 512/chip, data parallel"),
                       ("resnet-spatial", "ResNet-50, v4-8, 512/chip, spatial (H 2 x W 4)")):
        r = results.get(key)
        if r and "error" not in r:
            want = "does not fit" if key == "resnet-data" else "fits"
            got = "fits" if r["fits"] else "does not fit"
            lines.append(f"| {label} | {want} | {got}: peak {r['peak'] / gb:.1f} GB of "
                         f"{r['capacity'] / gb:.1f} GB | {'agrees' if want == got else 'DISAGREES'} |")
    ll = results.get("llama70b")
    if ll and "error" not in ll:
        lines.append(f"| Llama {ll['params'] / 1e9:.1f}B, 2-D (256 fsdp x 8 tensor), 2048 x v5p | "
                     f"plan < 60 s, < 4 GB host | {ll['seconds']:.1f} s, "
                     f"{ll['maxrss'] / gb:.2f} GB host | predicted step {ll['predicted']:.2f} s, "
                     f"MFU {ll['mfu'] * 100:.1f}%, peak {ll['peak'] / gb:.1f} GB |")
    lp = results.get("llama70b-pipeline")
    if lp and "error" not in lp:
        lines.append(f"| same, 80 blocks as a 4-stage pipeline x 64 fsdp x 8 tensor, 4 micro-batches, "
                     f"checkpointed | plan < 60 s; bubble (S-1)/(M+S-1) = "
                     f"{lp['bubble_formula'] * 100:.1f}% | {lp['seconds']:.1f} s, "
                     f"{lp['maxrss'] / gb:.2f} GB host; bubble {lp['bubble'] * 100:.1f}% of the loop, "
                     f"{lp['permutes']} collective-permutes ({lp['permute_bytes'] / 2**20:.0f} MiB) | "
                     f"predicted step {lp['predicted']:.2f} s, MFU {lp['mfu'] * 100:.1f}%, "
                     f"peak per stage {lp['peak'] / gb:.1f} GB |")
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | | error: {r['error']} | |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--only", nargs="*", default=list(STUDIES))
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(STUDIES[args.child]()))
        return
    results = {}
    for name in args.only:
        results[name] = run_child(name)
        print(name, json.dumps(results[name]), flush=True)
    text = table(results)
    print(text)
    if args.write:
        sys.path.insert(0, HERE)
        from common.docs import write_section
        write_section(os.path.join(ROOT, "docs", "benchmarks.md"),
                      "Plan mode against published numbers",
                      "`python benchmarks/plan.py --write` (each study a fresh process; plans "
                      "allocate nothing, so pod-sized steps run on this 2-core host).\n\n" + text
                      + "\n\n" + NOTES)


if __name__ == "__main__":
    main()
