"""Hugging Face models as users run them (issue 23): sdpa against eager attention, flat
decoding, and HF training steps planned at scale with HF's own forward.

    python benchmarks/hf_models.py [--write]

1. A tiny HF Llama training step (AdamW), FSDPv2 over 8 emulated devices, batch 8 x 256:
   sdpa (HF's default, one fused op per attention on the device) against eager attention
   (matmul + softmax + matmul): step time on this host and peak bytes per device.
2. Greedy `generate` of a 2-layer Llama: 64 tokens against 8 tokens x 8 (decoding stays flat
   when each token's graph keeps its size), with HF's dynamic and static caches, and the
   programs each call compiles (a static cache: the same few per call, whatever its length,
   as each call sizes its cache anew).
3. Plan mode with HF's forward (use_cache=False and an attention mask, whose values HF's mask
   code reads): Llama-2-7B, FSDPv2 on 64 TPU v5p, batch 2 x 2048 per device, bf16, AdamW; and
   Llama-3-70B, 2-D (fsdp 32 x tensor 8) on 256 TPU v5p, batch 1 x 4096 per fsdp shard. Plan
   time, peak per device and predicted step, with sdpa and with eager attention.
"""
import argparse
import functools
import gc
import os
import sys
import time

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch_spmd  # noqa: E402
import torch_spmd.core.xla_model as xm  # noqa: E402
import torch_spmd.debug.metrics as metrics  # noqa: E402
import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.plan as plan  # noqa: E402
from torch_spmd.distributed.wrap import transformer_auto_wrap_policy  # noqa: E402
from torch_spmd.experimental.spmd_fully_sharded_data_parallel import \
    SpmdFullyShardedDataParallel as FSDPv2  # noqa: E402

from common.docs import write_section  # noqa: E402

DEV = torch_spmd.device()


def tiny_llama(impl: str, layers: int = 2) -> transformers.LlamaConfig:
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512)
    cfg._attn_implementation = impl
    return cfg


def training_step(impl: str, steps: int = 5) -> dict:
    mesh = xs.Mesh(np.arange(8), (8,), ("fsdp",))
    torch.manual_seed(0)
    model = FSDPv2(transformers.LlamaForCausalLM(tiny_llama(impl)), mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (8, 256)).to(DEV)
    xs.mark_sharding(ids, mesh, ("fsdp", None))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        xm.mark_step()
        xm.wait_device_ops()
        times.append(time.perf_counter() - t0)
    stats = torch_spmd.debug.last_step_stats()
    return dict(seconds=float(np.median(times[2:])), peak=stats["peak_bytes_per_device"],
                fallbacks=dict(stats["replicated_fallback_ops"]))


def _compiles() -> int:
    data = metrics.metric_data("CompileTime")
    return data[0] if data else 0


def decoding(cache: str) -> dict:
    """Greedy generate of 8 and 64 tokens with HF's `cache` implementation ("dynamic" or
    "static"): wall time and programs compiled, after a warm-up call."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama("sdpa")).eval().to(DEV)
    ids = torch.randint(0, 512, (2, 8)).to(DEV)
    kw = dict(do_sample=False, pad_token_id=0, cache_implementation=cache)
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw).cpu()  # warm up
    out = {}
    for n in (8, 64):
        compiled = _compiles()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw).cpu()
        out[n] = time.perf_counter() - t0
        out[f"compiles{n}"] = _compiles() - compiled
    return out


def planned(name: str, impl: str) -> dict:
    if name == "llama-2-7b":
        cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                       num_hidden_layers=32, num_attention_heads=32,
                                       num_key_value_heads=32, max_position_embeddings=4096)
        devices, shape, batch, seq = 64, (64, 1), 128, 2048
    else:
        cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=8192,
                                       intermediate_size=28672, num_hidden_layers=80,
                                       num_attention_heads=64, num_key_value_heads=8,
                                       max_position_embeddings=8192, rope_theta=500000.0)
        devices, shape, batch, seq = 256, (32, 8), 32, 4096
    cfg._attn_implementation = impl
    t0 = time.perf_counter()
    with plan.Plan(num_devices=devices, hardware="tpu-v5p") as p:
        mesh = xs.Mesh(np.arange(devices), shape, ("fsdp", "tensor"))
        with torch.device(DEV):
            model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
        if shape[1] > 1:  # Megatron specs over 'tensor', FSDP over 'fsdp' (PyTorch/XLA's Llama 2)
            for pname, prm in model.named_parameters():
                if prm.dim() != 2:
                    continue
                row_parallel = pname.endswith(("o_proj.weight", "down_proj.weight"))
                xs.mark_sharding(prm, mesh, ("fsdp", "tensor") if row_parallel else ("tensor", "fsdp"))
        # FSDPv2 per decoder layer, as PyTorch/XLA's Llama recipes wrap it: each layer's output
        # keeps the batch on 'fsdp'.
        layer_cls = {transformers.models.llama.modeling_llama.LlamaDecoderLayer}
        model = FSDPv2(model, mesh=mesh, auto_wrap_policy=functools.partial(
            transformer_auto_wrap_policy, transformer_layer_cls=layer_cls))
        opt = torch.optim.AdamW(model.parameters())
        xm.mark_step()
        ids = torch.zeros(batch, seq, dtype=torch.long, device=DEV)
        mask = torch.ones(batch, seq, dtype=torch.long, device=DEV)
        xs.mark_sharding(ids, mesh, ("fsdp", None))
        xs.mark_sharding(mask, mesh, ("fsdp", None))
        model(input_ids=ids, labels=ids, attention_mask=mask, use_cache=False).loss.backward()
        opt.step()
        xm.mark_step()
        report = p.report()
    seconds = time.perf_counter() - t0
    del model, opt
    gc.collect()
    return dict(plan_seconds=seconds, peak=report.peak_bytes_per_device[0],
                step=report.predicted_step_seconds, fits=report.fits, mfu=report.mfu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    lines = ["| tiny HF Llama step, FSDPv2 over 8 devices | step time (this host) | peak per device "
             "| replicated fallbacks |", "|---|---:|---:|---|"]
    steps = {impl: training_step(impl) for impl in ("sdpa", "eager")}
    for impl, r in steps.items():
        lines.append(f"| {impl} attention | {r['seconds'] * 1e3:.1f} ms | {r['peak'] / 2**20:.2f} MiB "
                     f"| {r['fallbacks'] or 'none'} |")
    dec = {cache: decoding(cache) for cache in ("dynamic", "static")}
    lines += ["", "| greedy generate, 2-layer Llama (2 x 8 prompt) | dynamic cache | static cache |",
              "|---|---:|---:|"]
    for n in (8, 64):
        lines.append(f"| {n} tokens: time (programs compiled) | " + " | ".join(
            f"{d[n] * 1e3:.0f} ms ({d[f'compiles{n}']})" for d in dec.values()) + " |")
    lines.append("| 64 tokens / (8 tokens x 8) | " +
                 " | ".join(f"{d[64] / (8 * d[8]):.2f}" for d in dec.values()) + " |")
    lines += ["", "| plan (TPU v5p), HF forward with use_cache=False and a mask | attention "
              "| plan time | peak per device | fits | predicted step | MFU |",
              "|---|---|---:|---:|---|---:|---:|"]
    for name, label in (("llama-2-7b", "Llama-2-7B, FSDPv2 64 chips, 128 x 2048"),
                        ("llama-3-70b", "Llama-3-70B, 2-D 32 x 8 on 256 chips, 32 x 4096")):
        for impl in ("sdpa", "eager"):
            r = planned(name, impl)
            lines.append(f"| {label} | {impl} | {r['plan_seconds']:.1f} s | "
                         f"{r['peak'] / 2**30:.1f} GiB | {'yes' if r['fits'] else 'no'} | "
                         f"{r['step']:.2f} s | {r['mfu'] * 100:.1f}% |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        body = ("`python benchmarks/hf_models.py --write` (transformers 5.24, tiny configs built in "
                "code; the plans use HF's own `LlamaForCausalLM` forward).\n\n" + table + "\n\n"
                "Issue 23's targets: the sdpa step costs no more than the eager one (peak and "
                "time); 64 tokens take < 2x the time of 8 tokens x 8; with a static cache a call "
                "compiles the same few programs however many tokens it generates (each call "
                "sizes its cache anew: the prefill and the first tokens' graphs; none per token "
                "after); both plans run HF's forward "
                "with `use_cache=False` and a mask in < 10 s, sdpa's peak no higher than eager's.")
        write_section(os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md"),
                      "Hugging Face models (issue 23)", body)


if __name__ == "__main__":
    main()
