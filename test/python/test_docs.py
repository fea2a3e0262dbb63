"""Every Python code block of the user guide runs (docs are part of the product)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
GUIDE = os.path.join(ROOT, "docs", "user_guide.md")


def _blocks():
    text = open(GUIDE).read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_guide_has_examples():
    assert len(_blocks()) >= 5


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_guide_block_runs(index):
    code = _blocks()[index]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
