"""Benchmark rows run in processes of their own (a plan resizes the emulated device set; device
counts and thread settings must not leak between rows)."""
import json
import os
import subprocess
import sys


def run_json_child(script: str, args, root: str, timeout: float = 1800) -> dict:
    """Runs `script args...` with PYTHONPATH=`root`: the JSON object its last stdout line
    prints, or {"error": its last stderr line} when it fails."""
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root), timeout=timeout)
    if out.returncode != 0:
        return dict(error=(out.stderr.strip().splitlines() or ["?"])[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])
