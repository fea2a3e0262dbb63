"""Plan == executed step over the training flows users write: SGD (momentum) / Adam / AdamW,
zero_grad() inside the step (before mark_step), outside it (at the start of the next one) or
never (gradients accumulating over steps), one optimizer kept across steps or a fresh one built
every step, under data parallel, FSDP, tensor parallel and 2-D layouts, and an FSDP GPT with a
fresh Adam every step and no zero_grad. Every step of every flow must report the same peak, resident bytes,
FLOPs, peak op and collectives planned and executed, and the resident bytes must be what the flow
really keeps (checked in closed form for FSDP, where every tensor is split 8 ways).

The matrix runs in one fresh process so no other test's tensors count as resident."""
from test_plan import run_script

MATRIX = r"""
import gc, itertools

KEYS = ("peak_bytes_per_device", "device_peak_bytes", "resident_bytes_per_device",
        "flops_per_device", "model_flops", "peak_op")
OPTIMIZERS = dict(sgd=lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
                  adam=lambda ps: torch.optim.Adam(ps, lr=1e-3),
                  adamw=lambda ps: torch.optim.AdamW(ps, lr=1e-3))


def summary(stats):
    s = {k: stats[k] for k in KEYS}
    s["collectives"] = [(c["kind"], c["axes"], c["group_size"], c["bytes"])
                        for c in stats["collectives"]]
    return s


def shard(model, x, mesh, layout):
    w0, b0, w2, b2 = model[0].weight, model[0].bias, model[2].weight, model[2].bias
    if layout == "fsdp":
        for p in model.parameters():
            xs.mark_sharding(p, mesh, (("data", "model"),) + (None,) * (p.dim() - 1))
    if layout in ("tp", "2d"):
        # Megatron: column-parallel then row-parallel; 2-D also splits the other weight dim
        # over the data axis (FSDP inside tensor parallel).
        other = "data" if layout == "2d" else None
        xs.mark_sharding(w0, mesh, ("model", other))
        xs.mark_sharding(b0, mesh, ("model",))
        xs.mark_sharding(w2, mesh, (other, "model"))
    if layout in ("dp", "fsdp", "2d"):
        xs.mark_sharding(x, mesh, ("data", None))


def train(layout, opt_name, zero_grad, fresh_optimizer, steps=3):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    model = copy.deepcopy(cpu).to("spmd")
    x = torch.randn(16, 32).to("spmd")
    shard(model, x, mesh, layout)
    make = OPTIMIZERS[opt_name]
    opt = make(model.parameters())
    out = []
    for _ in range(steps):
        if fresh_optimizer:
            opt = make(model.parameters())
        if zero_grad == "outside":
            opt.zero_grad()
        loss = model(x).pow(2).mean()  # kept, as a training loop keeps it to log
        loss.backward()
        opt.step()
        if zero_grad == "inside":
            opt.zero_grad()
        xm.mark_step()
        out.append(summary(last_step_stats()))
    return out


hw = dict(name="test", peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11,
          ring_bandwidth=1e10)
result = []
for case in itertools.product(("dp", "fsdp", "tp", "2d"), OPTIMIZERS, ("inside", "outside", "never"),
                              (False, True)):
    gc.collect()
    with plan.Plan(hardware=hw):
        planned = train(*case)
    gc.collect()
    executed = train(*case)
    result.append(dict(case=case, planned=planned, executed=executed))
print(json.dumps(result))
"""


PARAMS = 32 * 64 + 64 + 64 * 32 + 32
BATCH_SHARD = 16 * 32 * 4 // 4  # x split over the data axis (4 ways)
LOSS = 4


def expected_fsdp_resident(opt_name, zero_grad, fresh_optimizer):
    """Bytes per device an FSDP step keeps: every parameter, gradient and optimizer state
    tensor split 8 ways, x split 4 ways, the scalar loss. zero_grad() inside the step drops the
    gradients before the step ends; a fresh optimizer drops the previous one's state, which the
    new one rebuilds in the same step."""
    per_param = 4  # the parameter itself
    per_param += 0 if zero_grad == "inside" else 4
    per_param += dict(sgd=4, adam=8, adamw=8)[opt_name]
    return per_param * PARAMS // 8 + BATCH_SHARD + LOSS


def test_plan_equals_executed_over_the_flow_matrix():
    result = run_script(MATRIX)
    assert len(result) == 4 * 3 * 3 * 2
    for r in result:
        layout, opt_name, zero_grad, fresh = r["case"]
        for i, (planned, executed) in enumerate(zip(r["planned"], r["executed"])):
            assert planned == executed, (r["case"], i)
            assert executed["flops_per_device"] > 0 and executed["resident_bytes_per_device"] > 0
            if layout != "dp":
                assert executed["collectives"], (r["case"], "a sharded step communicates")
            if layout == "fsdp":
                assert executed["resident_bytes_per_device"] == \
                    expected_fsdp_resident(opt_name, zero_grad, fresh), (r["case"], i)
        # Steady state: the second and third steps of a flow are the same program.
        assert r["executed"][1] == r["executed"][2], r["case"]


GPT_FLOW = r"""
import sys
sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"].split(os.pathsep)[0], "benchmarks"))
from bench_model import GPT, GPTConfig
from torch_spmd.experimental.spmd_fully_sharded_data_parallel import \
    SpmdFullyShardedDataParallel as FSDPv2
import gc

KEYS = ("peak_bytes_per_device", "device_peak_bytes", "resident_bytes_per_device",
        "flops_per_device", "model_flops", "peak_op")


def train(steps=3):
    torch.manual_seed(0)
    cfg = GPTConfig()
    mesh = xs.Mesh(np.arange(8), (8,), ("fsdp",))
    model = FSDPv2(GPT(cfg).to("spmd"), mesh=mesh)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1))
    out = []
    for _ in range(steps):
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # fresh each step, no zero_grad
        x, y = tokens[:, :-1].to("spmd"), tokens[:, 1:].to("spmd")
        xs.mark_sharding(x, mesh, ("fsdp", None))
        xs.mark_sharding(y, mesh, ("fsdp", None))
        model.module.loss(x, y).backward()
        opt.step()
        xm.mark_step()
        s = last_step_stats()
        out.append({k: s[k] for k in KEYS} | {"collectives": [
            (c["kind"], c["bytes"]) for c in s["collectives"]]})
    return out


hw = dict(name="test", peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11,
          ring_bandwidth=1e10)
gc.collect()
with plan.Plan(hardware=hw):
    planned = train()
gc.collect()
print(json.dumps(dict(planned=planned, executed=train())))
"""


def test_plan_equals_executed_for_an_fsdp_gpt_with_a_fresh_optimizer_and_no_zero_grad():
    result = run_script(GPT_FLOW)
    for i, (planned, executed) in enumerate(zip(result["planned"], result["executed"])):
        assert planned == executed, i
        assert executed["collectives"]
