"""Plan mode: context parallelism, attention over a sequence sharded on a mesh axis (issue 50;
docs/benchmarks.md, "Context parallelism: ring and all-to-all attention").

1. One causal attention layer at 32k tokens (bf16, 32 heads of 128, batch 1), forward and
   backward, its sequence over the 8 GPUs of one h100-80gb host, in four layouts: the sequence
   whole on every device (replicated), the queries sharded over keys gathered whole (gather),
   ring attention (ring) and the all-to-all onto the heads (all_to_all; DeepSpeed's Ulysses).
2. A Llama 3 8B training step (bf16, AdamW, fused attention) at 128k tokens per sequence, 8
   sequences, on 64 h100-80gb (8 hosts): FSDP over 'fsdp' (8) and the sequence over 'cp' (8),
   each block checkpointed; ring beside all-to-all.

Each row in its own process; nothing is allocated. In plan mode the causal kernels are priced
as a pod's flash kernels run them: a masked tile is skipped, and in lockstep a step waits for
its slowest device.

    PYTHONPATH=. .venv/bin/python benchmarks/context_parallel.py [--write]
"""
import argparse
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def summary(r) -> dict:
    kinds = collections.Counter()
    for c in r.collectives:
        kinds[c["kind"]] += c["count"]
    return dict(peak=r.peak_bytes_per_device[0], peak_op=r.peak_op, fits=r.fits, step=r.predicted_step_seconds,
                compute=r.compute_seconds, exposed=r.exposed_communication_seconds,
                flops=r.flops_per_device, kinds=dict(kinds),
                collective_bytes=sum(c["bytes"] * c["count"] for c in r.collectives))


def attention_row(layout: str) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    import torch_spmd.runtime as xr
    torch.set_num_threads(1)
    method = "gather" if layout == "replicated" else layout
    with plan.Plan(num_devices=8, hardware="h100-80gb") as p, xr.context_parallel(method):
        mesh = xs.Mesh(np.arange(8), (8,), ("cp",))
        spec = (None, None, None if layout == "replicated" else "cp", None)
        q, k, v, grad_out = (torch.empty(1, 32, 32768, 128, dtype=torch.bfloat16, device="spmd")
                             for _ in range(4))
        for t in (q, k, v, grad_out):
            xs.mark_sharding(t, mesh, spec)
        for t in (q, k, v):
            t.requires_grad_()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        xm.mark_step()
        del grads
        return summary(p.report())


def llama_row(method: str) -> dict:
    sys.path.insert(0, HERE)
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    import torch_spmd.runtime as xr
    from plan_models import Llama, LlamaConfig
    torch.set_num_threads(1)
    cfg = LlamaConfig(layers=32, dim=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                      batch=8, seq=131072, sdpa=True)
    with plan.Plan(num_devices=64, hardware="h100-80gb", mesh_shape=(8, 8),
                   axis_names=("fsdp", "cp")) as p, xr.context_parallel(method):
        mesh = xs.get_global_mesh()
        with torch.device("spmd"):
            model = Llama(cfg).to(torch.bfloat16)
        for layer in model.layers:
            layer.forward = (lambda f: lambda x: torch.utils.checkpoint.checkpoint(
                f, x, use_reentrant=False))(layer.forward)
        for w in model.parameters():
            xs.mark_sharding(w, mesh, ("fsdp",) + (None,) * (w.dim() - 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        xm.mark_step()
        idx = torch.zeros(cfg.batch, cfg.seq, dtype=torch.long, device="spmd")
        xs.mark_sharding(idx, mesh, ("fsdp", "cp"))
        logits = model(idx)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), idx.reshape(-1)).backward()
        opt.step()
        xm.mark_step()
        return summary(p.report())


def kinds_text(kinds: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))


def table(title: str, rows: dict) -> str:
    from common.docs import rows_table
    return rows_table(
        [title, "peak per device", "collectives per device<", "bytes per device",
         "FLOPs per device", "compute", "exposed communication", "predicted step"], rows,
        lambda r: [f"{r['peak'] / 2**20:,.0f} MiB{'' if r['fits'] else ' (does not fit)'}",
                   kinds_text(r["kinds"]), f"{r['collective_bytes'] / 2**20:,.0f} MiB",
                   f"{r['flops'] / 1e12:.2f} TFLOP", f"{r['compute'] * 1e3:.2f} ms",
                   f"{r['exposed'] * 1e3:.2f} ms", f"{r['step'] * 1e3:.2f} ms"])


NOTES = """How to read it: at 32k tokens the gathered layout holds every device's whole keys and
values (and, backward, their gradients' partial sums) and runs the causal rows of its tile in
sequence order, so the last device, whose rows see nearly every key, sets the pace. The ring
holds two key/value tiles (the one in use and the one arriving: a quarter of the gathered
layout's keys and values), its permutes hide behind the blocks, and its load-balanced order
gives every device half a block per step; its queries' two halves run as two kernels, the
own half read in place, and the gradients' running sums are kept in fp32 as PyTorch's ring
attention keeps them (the peak's largest part after the inputs, outputs and tiles). The all-to-all
moves each of q, k, v and the output once (and the gradients back); it needs the kv heads to
split over the axis. Ratios are of the rows above, in one run. A prediction of the model, not a
measurement."""


def ratios(rows: dict) -> str:
    ring, rep, gat = rows.get("ring"), rows.get("replicated"), rows.get("gather")
    if not all(r and "error" not in r for r in (ring, rep, gat)):
        return ""
    return (f"Ring attention's peak per device is {ring['peak'] / rep['peak']:.3f} of the "
            f"replicated layout's and {ring['peak'] / gat['peak']:.3f} of the gathered keys'; "
            f"its predicted step {ring['step'] / gat['step']:.3f} of the gathered keys'. Its "
            f"forward passes each key/value tile on once per step: "
            f"{ring['kinds'].get('collective-permute', 0)} collective-permutes in all, forward "
            f"and backward (7 x 2 for k and v forward, 7 x 2 + 8 x 2 with the gradients "
            f"backward, 14 half-tile swaps of the load-balanced order).")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=2, metavar=("PART", "ROW"))
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--attention-only", action="store_true",
                    help="part 1 alone (the Llama step plans in minutes)")
    args = ap.parse_args()
    if args.child:
        part, row = args.child
        print(json.dumps((attention_row if part == "attention" else llama_row)(row)))
        return
    sys.path.insert(0, HERE)
    from common.children import run_json_child
    from common.docs import write_section
    attention = {row: run_json_child(__file__, ["--child", "attention", row], ROOT)
                 for row in ("replicated", "gather", "ring", "all_to_all")}
    parts = [table("32k-token causal attention, 8 x h100-80gb", attention), ratios(attention)]
    if not args.attention_only:
        llama = {row: run_json_child(__file__, ["--child", "llama", row], ROOT)
                 for row in ("ring", "all_to_all")}
        parts.append(table("Llama 3 8B, 8 x 128k tokens, 64 x h100-80gb (fsdp 8 x cp 8)", llama))
    text = "\n\n".join(parts)
    print(text)
    if args.write and not args.attention_only:
        write_section(os.path.join(ROOT, "docs", "benchmarks.md"),
                      "Context parallelism: ring and all-to-all attention (issue 50)",
                      "`python benchmarks/context_parallel.py --write`: " +
                      __doc__.split("\n\n")[1].replace("\n", " ") + " " +
                      __doc__.split("\n\n")[2].replace("\n", " ") + "\n\n" + text + "\n\n" +
                      NOTES)


if __name__ == "__main__":
    main()
