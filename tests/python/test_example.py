"""examples/python/numpy_linear.py against real shards: every worker converges."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT

EXAMPLE = ROOT / "examples" / "python" / "numpy_linear.py"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_numpy_linear_converges(cluster, mode):
    cl = cluster(2, 2, f'job = {{ mode = "{mode}"; partition_bytes = 32; }};\n'
                       'optimizer = { name = "sgd"; learning_rate = 0.05; };\n'
                       'train = { batch_size = 32; max_steps = 300; };\n')
    procs = [subprocess.Popen([sys.executable, str(EXAMPLE), "-c", str(cl.config),
                               "--task", str(t)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for t in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for t, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        m = re.search(r"^done: task=(\d+) steps=(\d+) examples=(\d+) loss=([0-9.]+) "
                      r"w_error=([0-9.]+) examples_per_sec=", out, re.M)
        assert m, out
        assert int(m.group(1)) == t and int(m.group(2)) == 300 and int(m.group(3)) == 9600
        assert float(m.group(4)) < 0.001, out      # the noise is 1e-4
        assert float(m.group(5)) < 0.02, out


def test_numpy_linear_bad_config(tmp_path):
    bad = tmp_path / "bad.cfg"
    bad.write_text('job = { mode = "fast"; };\n')
    p = subprocess.run([sys.executable, str(EXAMPLE), "-c", str(bad), "--task", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 78 and "job.mode" in p.stderr
