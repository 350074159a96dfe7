"""from_pretrained holds the weights once: no second host copy while it loads (a stacked array
allocated once, each file mapping closed after its read, each array moved to the device as its
host copy is dropped) and none once it returns. Measured in a fresh process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")

CHILD = r"""
import json, sys
import jax
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024
rss = lambda: status("VmRSS:")
from jaxrescore.models import from_pretrained
jax.numpy.zeros(1).block_until_ready()
before = rss()
model = from_pretrained(sys.argv[1])
weights = sum(x.nbytes for x in jax.tree.leaves(model.params)) / 2**20
print(json.dumps(dict(weights=weights, after=rss() - before,
                      peak=status("VmHWM:") - before)))
"""


def test_loading_peaks_near_the_weights_and_keeps_one_copy(tmp_path):
    from safetensors.numpy import save_file

    # many layers, a small vocabulary: the largest single array (moved to the device as its host
    # copy goes) is a small share of the weights, so the peak measures copies, not one embedding
    d, layers, vocab, positions = 384, 12, 8192, 256
    rng = np.random.default_rng(0)
    w = lambda *shape: rng.standard_normal(shape, np.float32) * 0.02  # noqa: E731
    t = {"wte.weight": w(vocab, d), "wpe.weight": w(positions, d),
         "ln_f.weight": np.ones(d, np.float32), "ln_f.bias": np.zeros(d, np.float32)}
    for i in range(layers):
        h = f"h.{i}."
        t.update({h + "ln_1.weight": np.ones(d, np.float32), h + "ln_1.bias": w(d),
                  h + "ln_2.weight": np.ones(d, np.float32), h + "ln_2.bias": w(d),
                  h + "attn.c_attn.weight": w(d, 3 * d), h + "attn.c_attn.bias": w(3 * d),
                  h + "attn.c_proj.weight": w(d, d), h + "attn.c_proj.bias": w(d),
                  h + "mlp.c_fc.weight": w(d, 4 * d), h + "mlp.c_fc.bias": w(4 * d),
                  h + "mlp.c_proj.weight": w(4 * d, d), h + "mlp.c_proj.bias": w(d)})
    save_file(t, str(tmp_path / "model.safetensors"))
    config = dict(model_type="gpt2", n_layer=layers, n_embd=d, n_head=6, n_positions=positions, n_ctx=positions,
                  vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    (tmp_path / "config.json").write_text(json.dumps(config))
    del t
    # the peak is this process's VmHWM: getrusage's ru_maxrss survives exec, so under a large
    # pytest worker it reports the worker's high-water mark, not the load's
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["weights"] > 60  # the model is big enough for the ratios to mean something
    assert m["after"] <= 1.2 * m["weights"], m  # one copy once it returns
    assert m["peak"] <= 1.5 * m["weights"], m  # was 2.2x: every layer's parts beside the stack, the file mapped
