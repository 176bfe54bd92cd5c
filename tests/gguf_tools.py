"""llama.cpp's own HF -> GGUF converter for the tests, from the llama.cpp tree that the
llama-cpp-python source package (PyPI) vendors: downloaded once into a cache folder
($SLOTSERVE_CACHE, default ~/.cache/slotserve), then run with this interpreter.

The converter identifies a BPE pre-tokenizer by hashing the tokens of a fixed text and
refuses tokenizers it has no hash for, as the demo model's is: ``convert`` then names
it ``gpt-2`` (the demo tokenizer is byte-level BPE with GPT-2's split). Nothing else of
the converter is touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "llama-cpp-python==0.3.36"
CACHE = Path(os.environ.get("SLOTSERVE_CACHE", Path.home() / ".cache" / "slotserve")) / "llama-cpp-converter"
WRAPPER = """
import runpy, sys
tree = sys.argv[1]
sys.path[:0] = [tree, tree + "/gguf-py"]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [tree + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter_tree() -> Path:
    """The extracted converter (convert_hf_to_gguf.py, conversion/, gguf-py/). Raises
    RuntimeError when it can be neither found nor downloaded."""
    tree = CACHE / "tree"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--no-binary",
        ":all:",
        PACKAGE,
        "-d",
        str(CACHE),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    archives = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        raise RuntimeError(f"cannot download {PACKAGE}: {done.stderr[-500:]}")
    prefix = archives[-1].name.removesuffix(".tar.gz") + "/vendor/llama.cpp/"
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    staging = CACHE / "staging"
    with tarfile.open(archives[-1]) as tar:
        members = [
            m for m in tar.getmembers() if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(wanted)
        ]
        for m in members:
            m.name = m.name[len(prefix) :]
        tar.extractall(staging, members=members, filter="data")
    staging.rename(tree)
    archives[-1].unlink()
    return tree


def convert(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """``folder`` (a Hugging Face checkpoint) as a GGUF at ``out``, written by llama.cpp's converter."""
    tree = converter_tree()
    cmd = [sys.executable, "-c", WRAPPER, str(tree), "--outfile", str(out), "--outtype", outtype, str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {done.stderr[-2000:]}")
    return out
