"""The order the partitioned program runs in, and what it keeps live. A stack of checkpointed
decoder layers under FSDP (benchmarks/plan_fidelity.py's Llama-style model, mixed precision,
AdamW) must grow the planned peak by about one layer's share of the step (its sharded weights,
gradients and optimizer state, and its checkpointed input), not by its recomputed activations
or gathered weights: the backward frees them as it goes, as eager PyTorch, FSDP and XLA's
scheduler do. (Run in the order of a DFS from the step's outputs, every layer's input-gradient
chain ran first and its weight gradients at the end, keeping each layer's recomputed
activations live across the whole backward: 9.75 MiB per layer here instead of 1.)"""
from test_plan import ROOT, run_script

D, FF, HEADS, HD, V, B, S, DEVICES = 256, 1024, 2, 128, 512, 16, 256, 8

CHECKPOINTED_DECODER = f"""
    import dataclasses, sys
    sys.path.insert(0, os.path.join({ROOT!r}, "benchmarks"))
    import plan_fidelity as pf
    run = pf.Run(group="test", name="stack", hardware="tpu-v5e", chips=8, style="llama", layers=0,
                 hidden={D}, heads={HEADS}, kv_heads={HEADS}, head_dim={HD}, ffn={FF}, vocab={V},
                 seq={S}, micro_batch={B}, global_batch={B}, tp=1, dp=1, fsdp=8, remat="full",
                 fused_attention=False, dtype="bf16", measured_s=1.0)

    def peak(layers):
        res = pf.plan_programs(dataclasses.replace(run, layers=layers), need_micro=False)
        return max(res["last"]["peak_bytes_per_device"])

    print(json.dumps({{"per_layer": (peak(6) - peak(2)) / 4}}))
"""


def test_checkpointed_layers_grow_the_peak_by_their_share():
    per_layer = run_script(CHECKPOINTED_DECODER)["per_layer"]
    params = 4 * D * HEADS * HD + 3 * D * FF + 2 * D
    state = params * 4 * 4 / DEVICES            # fp32 weights, gradients, AdamW's two moments
    checkpoint = B * S * D * 2 / DEVICES        # the layer's bf16 input, batch-sharded
    assert per_layer <= state + checkpoint, (per_layer, state, checkpoint)
