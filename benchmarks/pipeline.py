"""Pipeline parallelism benchmark: a GPT of 8 identical blocks trained on 8 emulated devices,
pipelined (torch_spmd.distributed.pipeline: 4 stages x 2-way data parallel) against the same
model unpipelined (8-way data parallel), side by side in one run.

Per layout: the emulated step time (host wall clock of a training step, median of 5 after 2
warm-up steps; the 8 devices share this machine's cores), its ratio to the unpipelined step,
the per-device peak, the collectives, and the executed step priced on an A100 preset
(``report_last_step``): the predicted step time and the bubble measured on it.

    PYTHONPATH=. python benchmarks/pipeline.py [--write]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import GPT, GPTConfig  # noqa: E402

CFG = GPTConfig(layers=8, dim=128, heads=4, seq=64, vocab=256, batch=32)
LAYOUTS = (("unpipelined, 8-way data parallel", None, 1),
           ("pipeline 4 stages x 2 data, 4 micro-batches", 4, 1),
           ("pipeline 4 stages x 2 data, 8 micro-batches", 8, 1),
           ("circular pipeline, 2 repeats, 4 micro-batches", 4, 2))
HARDWARE = "a100-80gb"


def measure(microbatches, repeats) -> dict:
    import numpy as np
    import torch
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from torch_spmd.distributed.pipeline import Pipeline

    torch.manual_seed(0)
    model = GPT(CFG)
    if microbatches:
        mesh = xs.Mesh(np.arange(8), (4, 2), ("stage", "data"))
        model.blocks = Pipeline(model.blocks, mesh, "stage", num_microbatches=microbatches,
                                repeats=repeats, activation_spec=("data", None, None))
        batch_axis = "data"
    else:
        mesh = xs.Mesh(np.arange(8), (8,), ("data",))
        batch_axis = "data"
    model.to(torch.device("spmd"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(7):
        idx = torch.randint(0, CFG.vocab, (CFG.batch, CFG.seq), generator=g).to("spmd")
        xs.mark_sharding(idx, mesh, (batch_axis, None))
        start = time.perf_counter()
        loss = model.loss(idx, idx.roll(-1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xm.mark_step()
        loss.item()
        times.append(time.perf_counter() - start)
    stats = torch_spmd.debug.last_step_stats()
    r = plan.report_last_step(HARDWARE)
    pipe = r.pipeline[0] if r.pipeline else {}
    kinds = {}
    for c in stats["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    return dict(step=statistics.median(times[2:]), peak=stats["peak_bytes_per_device"],
                collectives=kinds, predicted=r.predicted_step_seconds,
                bubble=pipe.get("bubble_fraction"), formula=pipe.get("bubble_fraction_formula"),
                loss=loss.item())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    import torch
    import torch_spmd.runtime as xr
    torch.set_num_threads(2)
    if xr.global_runtime_device_count() != 8:
        xr.configure_devices(8, "16GiB")
    xr.use_spmd()
    rows = [(name, measure(m, r)) for name, m, r in LAYOUTS]
    base = rows[0][1]
    lines = ["| layout | emulated step | vs unpipelined | peak / device | collectives | "
             f"priced on {HARDWARE} | bubble (planned / formula) |",
             "|---|---:|---:|---:|---|---:|---|"]
    for name, m in rows:
        coll = ", ".join(f"{k} x{n}" for k, n in sorted(m["collectives"].items()))
        bubble = (f"{m['bubble'] * 100:.1f}% / {m['formula'] * 100:.1f}%"
                  if m["bubble"] is not None else "")
        lines.append(f"| {name} | {m['step'] * 1e3:.0f} ms | {m['step'] / base['step']:.2f}x | "
                     f"{m['peak'] / 2**20:.1f} MiB | {coll} | {m['predicted'] * 1e3:.2f} ms | "
                     f"{bubble} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        from common.docs import write_section
        notes = (
            f"GPT of {CFG.layers} blocks (d={CFG.dim}, {CFG.heads} heads, seq {CFG.seq}, "
            f"vocab {CFG.vocab}, batch {CFG.batch}), AdamW, fp32, 8 emulated devices, this "
            "2-core host. The pipeline runs every stage in each of its R M + S - 1 iterations, "
            "on zeros in the bubble, so the emulated step pays the bubble like a pod does, and "
            "each iteration is a few small ops per device: on this host, where the 8 devices "
            "share 2 cores, the per-op overhead of M + S - 1 iterations (x2 for the backward) "
            "dominates at this size. The priced step is the executed program on the preset "
            "(communication of the permutes included); the bubble is measured on it: each "
            "iteration's planned time x its idle stages' share.")
        write_section(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                   "docs", "benchmarks.md"),
                      "Pipeline parallelism",
                      "`python benchmarks/pipeline.py --write`\n\n" + text + "\n\n" + notes)


if __name__ == "__main__":
    main()
