#!/usr/bin/env bash
# What a lent GPU machine checks, in one call (it starts bare and has no network): writes into
# $OUT (default /tmp/gpu_check)
#   gpu.json       benchmarks/gpu_check.py --measure: real eager training steps of the configs
#                  plan mode is compared against (plain PyTorch, no torch_spmd);
#   install.log    `pip install --no-build-isolation .` against the machine's own CUDA build of
#                  torch (a user's install), then torch_spmd next to a live CUDA device: tensors
#                  moved cuda <-> spmd, a sharded step equal to the same step on the GPU (its
#                  backward run before torch_spmd is imported: torch_spmd/_torch_patches/cuda_autograd.py), the
#                  demo and the smoke tests against the installed package.
# Then, here: python benchmarks/gpu_check.py --compare gpu.json --write
set -u
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # a crash prints its Python stack
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
root=$PWD
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$py" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'

echo "== measure"
[ -n "${SKIP_MEASURE:-}" ] || timeout "${MEASURE_TIMEOUT:-150}" "$py" benchmarks/gpu_check.py --measure "$out/gpu.json" 2>&1 \
  | grep -v "USDT\|^STAGE:" | tee "$out/measure.log"

echo "== install"
{
  start=$(date +%s)
  MAX_JOBS=$(nproc) timeout "${BUILD_TIMEOUT:-240}" "$py" -m pip install -q --no-build-isolation \
    --no-deps --no-cache-dir . 2>&1 | grep -v "^WARNING: Running pip as\|^WARNING: Location" | tail -20
  echo "install rc=${PIPESTATUS[0]} in $(( $(date +%s) - start )) s"
  work=$(mktemp -d)
  cd "$work"
  "$py" - <<'EOF'
import numpy as np, torch
torch.manual_seed(0)
x = torch.randn(64, 32, device="cuda")
w = torch.randn(32, 16, device="cuda", requires_grad=True)
ref = (x @ w).relu().sum()
ref.backward()  # before torch_spmd is imported (see torch_spmd/_torch_patches/cuda_autograd.py)
import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
print("torch_spmd from", torch_spmd.__file__)
mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
sx = x.to("spmd")
sw = w.detach().to("spmd").requires_grad_()
xs.mark_sharding(sx, mesh, ("data", None))
xs.mark_sharding(sw, mesh, (None, "model"))
loss = (sx @ sw).relu().sum()
loss.backward()
xm.mark_step()
back = sw.grad.to("cuda")
assert back.device.type == "cuda"
torch.testing.assert_close(back, w.grad, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(loss.to("cuda"), ref, rtol=1e-4, atol=1e-3)
torch.testing.assert_close((x @ w).relu().sum(), ref)  # a CUDA forward still runs
print("cuda -> spmd sharded step -> cuda equals the GPU's: OK")
try:
    (x @ w).sum().backward()
    print("a CUDA backward after importing torch_spmd: runs")
except RuntimeError as e:
    print("a CUDA backward after importing torch_spmd:", str(e)[:160])
EOF
  echo "interplay rc=$?"
  timeout 90 "$py" "$root/examples/demo.py" --steps 20 >"$out/demo.log" 2>&1
  rc=$?
  echo "demo rc=$rc"
  tail -4 "$out/demo.log"
  if [ $rc != 0 ]; then  # the GPU's presence, or this machine?
    CUDA_VISIBLE_DEVICES= timeout 90 "$py" "$root/examples/demo.py" --steps 20 >"$out/demo_nocuda.log" 2>&1
    echo "demo with CUDA hidden rc=$?"
  fi
  mkdir -p "$work/t/test" && cp -r "$root/test/python" "$work/t/test/python"
  # Full failure reports in tests.log; a test that needs no GPU but fails only here is a
  # portability defect.
  timeout 150 "$py" -m pytest -q -p no:cacheprovider -n 8 -rf --tb=short \
    "$work"/t/test/python/{test_api,test_mark_step,test_errors,test_error_paths,test_torch_interplay,test_autocast}.py \
    >"$out/tests.log" 2>&1
  rc=$?
  echo "tests rc=$rc"
  tail -15 "$out/tests.log"
  if [ $rc != 0 ]; then
    CUDA_VISIBLE_DEVICES= timeout 120 "$py" -m pytest -q -p no:cacheprovider -n 8 -rf --tb=short \
      "$work"/t/test/python/{test_api,test_mark_step,test_errors}.py >"$out/tests_nocuda.log" 2>&1
    echo "tests with CUDA hidden rc=$?"
    tail -8 "$out/tests_nocuda.log"
  fi
} 2>&1 | tee "$out/install.log"
