"""Plan mode against real training steps on one GPU (issue 22's GPU check).

Two halves, run on different machines:

- ``--measure OUT.json`` (on a machine with a CUDA GPU; plain PyTorch, no torch_spmd): times
  eager training steps of a few GPT and Llama configs built by ``plan_fidelity._decoder`` (the
  same model code plan_fidelity plans), with the same optimizer and precision, and records per
  config the median step time, the peak and resident allocated bytes, and the GPU's kernel time
  split into matmuls, attention and the rest (torch.profiler over one step). It also records the
  device's own ceilings: a large bf16 matmul's FLOP/s, a device copy's bandwidth, and the host's
  time per small eager op.
- ``--compare IN.json [--write]`` (here): plans each config on the preset of the GPU it ran on
  (one device) and prints predicted vs measured step time, peak memory, and the planned
  compute-bound / memory-bound / host-bound split next to the measured kernel classes;
  ``--write`` puts the table into docs/benchmarks.md.

The presets' constants are not fitted to these numbers (plan_calibration's rule: constants are
fitted on its published rows only); the check says how far the h100/h200 presets, whose
constants are transferred (h200: h100-80gb's, fitted on Megatron-LM's H100 row), are from a
real step of eager PyTorch and where the difference lies. The step it runs is plain PyTorch's:
torch's foreach AdamW, not the fused kernel Megatron-LM's runs use in plan_fidelity.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from plan_fidelity import Run, _decoder, make_optimizer, micro_step, warm_up  # noqa: E402


def _run(name, style, layers, hidden, heads, ffn, seq, batch, remat="none", fused=True,
         kv_heads=None, vocab=None):
    return Run(group="gpu-check", name=name, hardware="", chips=1, style=style, layers=layers,
               hidden=hidden, heads=heads, kv_heads=kv_heads or heads, head_dim=hidden // heads,
               ffn=ffn, vocab=vocab or (50257 if style == "gpt" else 32000), seq=seq,
               micro_batch=batch, global_batch=batch, tp=1, dp=1, fsdp=1, remat=remat,
               fused_attention=fused, dtype="bf16", measured_s=0.0, optimizer=GPU_CHECK_OPTIMIZER)


# The AdamW kernels the GPU check runs (and its stored measurements ran): torch's foreach,
# what a plain PyTorch script gets, whose whole-list temporaries can hold a step's peak.
GPU_CHECK_OPTIMIZER = "foreach"


# GPT: Megatron-LM's mixed precision (bf16 parameters, fp32 main copies and AdamW); Llama:
# MaxText's (fp32 parameters cast at use, fp32 AdamW). Sizes from small (host-bound) to ~1.3B.
CONFIGS = [
    _run("gpt-125m s1024 b8", "gpt", 12, 768, 12, 3072, 1024, 8),
    _run("gpt-350m s1024 b8", "gpt", 24, 1024, 16, 4096, 1024, 8),
    _run("gpt-760m s2048 b4 remat", "gpt", 24, 1536, 16, 6144, 2048, 4, remat="full"),
    _run("gpt-1.3b s2048 b4", "gpt", 24, 2048, 16, 8192, 2048, 4),
    _run("gpt-1.3b s2048 b2 unfused remat", "gpt", 24, 2048, 16, 8192, 2048, 2, remat="full",
         fused=False),
    _run("llama-1b s2048 b4", "llama", 16, 2048, 16, 5632, 2048, 4, kv_heads=8),
]
TINY = [_run("tiny gpt", "gpt", 2, 64, 4, 256, 32, 2, vocab=512),
        _run("tiny llama", "llama", 2, 64, 4, 176, 32, 2, kv_heads=2, vocab=512)]


# ---------------------------------------------------------------------------------------------
# On the GPU


def _kernel_class(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "cudnn_sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "xmma", "cutlass", "nvjet", "cublas", "sm90_", "sm80_")):
        return "matmul"
    return "other"


def _step_fn(r: Run, device: str):
    """The step plan_fidelity plans for a run of one micro-step, on `device`."""
    import torch
    model = _decoder(r, device)
    opt = make_optimizer(r, model.parameters())
    warm_up(opt, list(model.parameters()))
    idx = torch.randint(0, r.vocab, (r.micro_batch, r.seq), device=device)

    def step():
        micro_step(r, model, idx)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _profile(step, device: str) -> dict:
    """GPU kernel time of one step by class, and the number of kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    cuda = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    by_class = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    kernels = 0
    for ev in prof.key_averages():
        if cuda:  # with only the CUDA activity, each entry is a kernel (or a copy/memset)
            us = getattr(ev, "self_device_time_total", None)
            us = ev.self_cuda_time_total if us is None else us
        else:
            us = ev.self_cpu_time_total
        by_class[_kernel_class(ev.key)] += us * 1e-6
        kernels += ev.count
    return dict(kernel_seconds=by_class, kernels=kernels)


def _time(fn, device, repeat):
    import torch
    times = []
    for _ in range(repeat):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_ceilings(device: str) -> dict:
    import torch
    n = 8192 if device.startswith("cuda") else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    mm = _time(lambda: a @ b, device, 10)
    src = torch.empty(1 << 30 if device.startswith("cuda") else 1 << 24, dtype=torch.uint8,
                      device=device)
    dst = torch.empty_like(src)
    copy = _time(lambda: dst.copy_(src), device, 10)
    x = torch.zeros(16, device=device)

    def small_ops():  # host-bound: each op's issue time
        for _ in range(1000):
            x.add_(1)
    per_op = _time(small_ops, device, 5) / 1000
    return dict(matmul_flops_bf16=2 * n ** 3 / mm, copy_bandwidth=2 * src.numel() / copy,
                host_seconds_per_small_op=per_op)


def measure(configs, device: str) -> dict:
    import torch
    torch.manual_seed(0)
    out = dict(device=device, torch=torch.__version__, ceilings=measure_ceilings(device),
               runs=[])
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_bytes=props.total_memory,
                   multiprocessors=props.multi_processor_count)
    for r in configs:
        row = dict(name=r.name, run=r.__dict__)
        try:
            step = _step_fn(r, device)
            for _ in range(3):
                step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                row["resident_bytes"] = torch.cuda.memory_allocated()
            row["step_seconds"] = _time(step, device, 10)
            if device.startswith("cuda"):
                row["peak_bytes"] = torch.cuda.max_memory_allocated()
            row.update(_profile(step, device))
        except Exception as e:  # a config that does not fit is a result, not a crash
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        out["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "run"}), flush=True)
        if device.startswith("cuda"):
            del step
            torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------------------------------------
# Here: the plans

PRESET_BY_GPU = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"))


def _preset(gpu_name: str) -> str:
    for key, preset in PRESET_BY_GPU:
        if key in gpu_name:
            return preset
    raise SystemExit(f"no plan preset for GPU {gpu_name!r}; expected one of "
                     f"{[k for k, _ in PRESET_BY_GPU]}")


def measured_constants(measured: dict, preset: str) -> dict:
    """The preset's efficiencies and host time per kernel as this machine's own ceilings give
    them (microbenchmarks, not fitted to the steps): a large matmul's share of the peak, a
    device copy's share of the HBM bandwidth, a small eager op's host time."""
    import torch_spmd.plan as plan
    hw, c = plan.resolve(preset), measured["ceilings"]
    return dict(matmul_efficiency=min(1.0, c["matmul_flops_bf16"] / hw["peak_flops_bf16"]),
                hbm_efficiency=min(1.0, c["copy_bandwidth"] / hw["hbm_bandwidth"]),
                kernel_overhead=c["host_seconds_per_small_op"])


def compare(measured: dict) -> list:
    sys.path.insert(0, ROOT)
    import plan_fidelity
    from plan_fidelity import plan_programs
    preset = _preset(measured.get("gpu", ""))
    own = measured_constants(measured, preset)
    rows = []
    for m in measured["runs"]:
        if "error" in m:
            rows.append(dict(name=m["name"], error=m["error"]))
            continue
        r = Run(**{"optimizer": GPU_CHECK_OPTIMIZER, **m["run"], "hardware": preset})
        plan_fidelity.OVERRIDES.pop(preset, None)
        planned = plan_programs(r, need_micro=False)["last"]
        plan_fidelity.OVERRIDES[preset] = own
        with_own = plan_programs(r, need_micro=False)["last"]
        plan_fidelity.OVERRIDES.pop(preset)
        rows.append(dict(
            predicted_own_s=with_own["predicted_step_seconds"],
            name=m["name"], preset=preset, measured_s=m["step_seconds"],
            predicted_s=planned["predicted_step_seconds"],
            compute_bound_s=planned["compute_bound_seconds"],
            memory_bound_s=planned["memory_bound_seconds"],
            host_bound_s=planned["host_bound_seconds"],
            kernels=m["kernel_seconds"], n_kernels=m["kernels"],
            measured_peak=m.get("peak_bytes", 0), planned_peak=planned["peak_bytes_per_device"][0],
            fits=planned["fits"]))
    return rows


def table(measured: dict, rows: list) -> str:
    c = measured["ceilings"]
    own = measured_constants(measured, _preset(measured.get("gpu", "")))
    lines = [
        f"Measured on one {measured.get('gpu', measured['device'])} (torch {measured['torch']}), "
        f"planned on `{_preset(measured.get('gpu', ''))}` (one device, the preset as published, "
        "its constants transferred as the preset lists them, not fitted to these steps). Ceilings measured there: bf16 8192^3 matmul "
        f"{c['matmul_flops_bf16'] / 1e12:.0f} TFLOP/s, device copy "
        f"{c['copy_bandwidth'] / 1e12:.2f} TB/s, host time per small eager op "
        f"{c['host_seconds_per_small_op'] * 1e6:.1f} us. 'With its ceilings': the preset with "
        f"matmul_efficiency {own['matmul_efficiency']:.2f}, hbm_efficiency "
        f"{own['hbm_efficiency']:.2f} and kernel_overhead {own['kernel_overhead'] * 1e6:.1f} us "
        "taken from those.",
        "",
        "| config | measured step | predicted (error) | with its ceilings (error) | GPU kernels: matmul / attention / other "
        "(count) | planned compute- / memory- / host-bound | measured peak | planned peak |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} | | | | | | |")
            continue
        k = r["kernels"]
        err = r["predicted_s"] / r["measured_s"] - 1
        err_own = r["predicted_own_s"] / r["measured_s"] - 1
        lines.append(
            f"| {r['name']} | {r['measured_s'] * 1e3:.1f} ms | {r['predicted_s'] * 1e3:.1f} ms "
            f"({err:+.0%}) | {r['predicted_own_s'] * 1e3:.1f} ms ({err_own:+.0%}) | {k['matmul'] * 1e3:.1f} / {k['attention'] * 1e3:.1f} / "
            f"{k['other'] * 1e3:.1f} ms ({r['n_kernels']}) | "
            f"{r['compute_bound_s'] * 1e3:.1f} / {r['memory_bound_s'] * 1e3:.1f} / "
            f"{r['host_bound_s'] * 1e3:.1f} ms | {r['measured_peak'] / 2 ** 30:.2f} GiB | "
            f"{r['planned_peak'] / 2 ** 30:.2f} GiB |")
    return "\n".join(lines)


def write(text: str) -> None:
    sys.path.insert(0, HERE)
    from common.docs import write_section
    write_section(os.path.join(ROOT, "docs", "benchmarks.md"),
                  "Plan mode against one real GPU (issue 22)",
                  "`scripts/gpu_check.sh` on a lent GPU (its `gpu.json` is kept as "
                  "`benchmarks/data/gpu_check_<gpu>.json`), then `python benchmarks/gpu_check.py "
                  "--compare benchmarks/data/gpu_check_<gpu>.json --write` here; docs/plan_mode.md "
                  "(\"Against one real GPU\") reads the numbers.\n\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", metavar="OUT.json")
    ap.add_argument("--compare", metavar="IN.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (a smoke test on the CPU)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    configs = TINY if args.tiny else CONFIGS
    if args.measure:
        json.dump(measure(configs, args.device), open(args.measure, "w"), indent=1)
    if args.compare:
        measured = json.load(open(args.compare))
        rows = compare(measured)
        text = table(measured, rows)
        print(text)
        if args.write:
            write(text)


if __name__ == "__main__":
    main()
