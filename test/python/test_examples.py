"""The example scripts run (with tiny arguments) and print their final line."""
import os
import re
import subprocess
import sys
import pytest

# Minutes of work (processes, examples, sweeps): scripts/test.sh runs it, plain pytest does not.
pytestmark = pytest.mark.slow


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
GPT_TINY = ["--batch-size", "16", "--block-size", "16", "--n-embd", "32", "--n-head", "2",
            "--eval-batches", "1"]
FINAL_LOSS = re.compile(r"final loss: train \d+\.\d+ \(mean of last 10 steps\), validation "
                        r"\d+\.\d+ \(\d+\.\d+ bits/byte\)$")


def run_example(name, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SPMD_NUM_DEVICES", None)  # the scripts' --devices decides
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "it/s" in proc.stderr or "step/s" in proc.stderr  # the tqdm progress bar
    return lines


def test_digits_data_parallel():
    lines = run_example("train_digits_dp.py", "--epochs", "2", "--devices", "4")
    assert "mesh {'data': 4}" in lines[0]
    assert "collectives per training step: {'all-reduce':" in lines[-3]
    m = re.match(r"final test accuracy: (\d\.\d+) \(\d+/359\)$", lines[-1])
    assert m and float(m.group(1)) > 0.5, lines[-1]


def test_gpt_fsdpv2_and_resume(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    first = run_example("train_gpt_fsdpv2.py", "--steps", "4", "--ckpt-dir", ckpt_dir,
                        "--ckpt-every", "2", *GPT_TINY)
    assert FINAL_LOSS.match(first[-1]), first[-1]
    assert "'reduce-scatter'" in first[-2] and "'all-gather'" in first[-2]
    assert sorted(os.listdir(ckpt_dir)) == ["2", "4"]
    second = run_example("train_gpt_fsdpv2.py", "--steps", "6", "--ckpt-dir", ckpt_dir,
                         "--ckpt-every", "2", *GPT_TINY)
    assert f"resumed from step 4 ({ckpt_dir})" in second
    assert second[-2].startswith("2 steps in")
    assert sorted(os.listdir(ckpt_dir)) == ["4", "6"]  # max_to_keep=2


def test_gpt_fsdpv2_extra_data_axis():
    lines = run_example("train_gpt_fsdpv2.py", "--steps", "3", "--dp", "2", "--no-auto-wrap",
                        *GPT_TINY)
    assert "mesh {'data': 2, 'fsdp': 4}" in lines[0]
    assert FINAL_LOSS.match(lines[-1]), lines[-1]


def test_gpt_2d():
    lines = run_example("train_gpt_2d.py", "--steps", "3", *GPT_TINY)
    assert "mesh {'fsdp': 4, 'tensor': 2}" in lines[0]
    assert "blocks.0.attn.q.weight" in lines[1] and "{devices=[2,4]0,2,4,6,1,3,5,7}" in lines[1]
    assert "['tensor']" in lines[-2] and "['fsdp']" in lines[-2]
    assert FINAL_LOSS.match(lines[-1]), lines[-1]


def test_fsdp_nested_checkpointing_and_consolidation(tmp_path):
    lines = run_example("train_fsdp_nested_ckpt.py", "--steps", "6", "--nprocs", "2",
                        "--ckpt-dir", str(tmp_path))
    m = re.match(r"2 processes, ZeRO-3 \+ checkpointing, 6 steps: validation loss (\d+\.\d+) "
                 r"\(sharded model\), (\d+\.\d+) \(consolidated, on CPU\)$", lines[-1])
    assert m and m.group(1) == m.group(2), lines[-1]
    assert (tmp_path / "final_ckpt_consolidated.pth").exists()
    assert len(list(tmp_path.glob("final_ckpt_rank-*-of-00000002.pth"))) == 2


def test_demo_learns_like_cpu_and_reports_the_sharded_step():
    lines = run_example("demo.py", "--steps", "30")
    header = lines.index(next(l for l in lines if l.split()[:3] == ["step", "spmd", "loss"]))
    rows = []
    for line in lines[header + 1:]:
        parts = line.split()
        if len(parts) != 4 or not parts[0].isdigit():
            break
        rows.append((int(parts[0]), float(parts[1]), float(parts[2])))
    assert len(rows) >= 5 and rows[-1][0] == 29, rows
    for step, spmd, cpu in rows:
        assert abs(spmd - cpu) <= 1e-5 * max(1.0, abs(cpu)), (step, spmd, cpu)
    assert rows[-1][1] < rows[0][1] - 0.3, f"the loss did not fall: {rows}"
    text = "\n".join(lines)
    # What a sharded run is for: layouts, collectives and per-device memory.
    assert re.search(r"0\.weight\s+\(256, 32\)\s+\{devices=", text), text
    assert re.search(r"all-reduce\s+x\d+", text), text
    assert sum(1 for l in lines if re.match(r"\s+device \d: ", l)) == 8, text
