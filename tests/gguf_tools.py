"""llama.cpp's own HF -> GGUF converter for the tests, from the llama.cpp tree that the
llama-cpp-python source package (PyPI) vendors: downloaded once into a cache folder
($SLOTSERVE_CACHE, default ~/.cache/slotserve), then run with this interpreter.

The converter identifies a BPE pre-tokenizer by hashing the tokens of a fixed text and
refuses tokenizers it has no hash for, as every tiny vocabulary is: ``convert`` names
the family's pre-tokenizer when told it (``pre=``: a vocabulary trained with that
family's split, tests/family_tokenizers.py), else ``gpt-2`` (the demo tokenizer is
byte-level BPE with GPT-2's split). Nothing else of the converter is touched.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import gguf
import numpy as np

PACKAGE = "llama-cpp-python==0.3.36"
CACHE = Path(os.environ.get("SLOTSERVE_CACHE", Path.home() / ".cache" / "slotserve")) / "llama-cpp-converter"
RUNNER = """
import gc, json, os, runpy, sys, traceback
tree, answers = sys.argv[1], os.fdopen(int(sys.argv[2]), "w")
sys.path[:0] = [tree, tree + "/gguf-py"]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
forced = None
def get_vocab_base_pre(self, tokenizer):
    if forced:
        return forced
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
for line in sys.stdin:  # a group of conversions a line, until the test process ends
    error = None
    for script, args, forced in json.loads(line):
        sys.argv = [tree + "/" + script, *args]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            error = None if exc.code in (None, 0) else f"{script} exited with {exc.code}"
        except BaseException:
            error = traceback.format_exc()
        if error:
            break
    gc.collect()  # the last conversion's tensors, before the next group
    answers.write(json.dumps(error) + "\\n")
    answers.flush()
"""


class _Converter:
    """One interpreter that has imported llama.cpp's converter (torch, transformers,
    gguf-py: ~4 s of CPU) and runs the conversions it is sent, one group at a time, for
    as long as the test process lives (it ends at its stdin's end)."""

    def __init__(self, tree: Path):
        import tempfile

        self.log = tempfile.TemporaryFile()  # its stderr: the converter's log, read back on a failure
        read, write = os.pipe()
        cmd = [sys.executable, "-c", RUNNER, str(tree), str(write)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.log,
                                     pass_fds=(write,), text=True)  # fmt: skip
        os.close(write)
        self.answers = os.fdopen(read)
        self.start = 0

    def send(self, runs: list) -> None:
        self.start = self.log.seek(0, os.SEEK_END)
        self.proc.stdin.write(json.dumps(runs) + "\n")
        self.proc.stdin.flush()

    def wait(self) -> str | None:
        """None when the group converted, else what went wrong (with its log)."""
        line = self.answers.readline()
        self.log.seek(self.start)
        log = self.log.read().decode(errors="replace")[-2000:]
        if not line:
            return f"the converter exited with {self.proc.wait()}: {log}"
        error = json.loads(line)
        return None if error is None else f"{error[-2000:]}\n{log}"


_CONVERTERS: list[_Converter] = []


def _run_converters(groups: list[list[tuple[str, list[str], str | None]]]) -> None:
    """Each group of (script, args, pre-tokenizer name or None) runs in one of this
    process's converter interpreters (started on first use, kept for the next call:
    the suite converts ~25 times), the groups side by side."""
    tree = converter_tree()
    while len(_CONVERTERS) < len(groups):
        _CONVERTERS.append(_Converter(tree))
    used = list(zip(groups, _CONVERTERS, strict=False))
    for runs, converter in used:
        converter.send(runs)
    failures = []
    for runs, converter in used:
        if (error := converter.wait()) is not None:
            failures.append(f"{', '.join(sorted({run[0] for run in runs}))} failed: {error}")
            if converter.proc.poll() is not None:
                _CONVERTERS.remove(converter)
    if failures:
        raise RuntimeError("\n".join(failures))


MTMD_PHOTO = "tools/mtmd/test-1.jpeg"  # the photo llama.cpp's multimodal tests use
TEMPLATES = "models/templates/"  # ~70 real chat templates, copied from model repositories
LLAMA_VOCAB = "src/llama-vocab.cpp"  # the pre-tokenizer names llama.cpp knows (tests/test_pre_tokenizers.py)


def mtmd_photo():
    """llama.cpp's multimodal test photo (from the pinned sdist) as an RGB PIL image."""
    from PIL import Image

    return Image.open(converter_tree() / MTMD_PHOTO).convert("RGB")


def converter_tree() -> Path:
    """The extracted converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py,
    conversion/, gguf-py/), libmtmd's test photo (tools/mtmd/test-1.jpeg), the real
    chat templates of models/templates/ and llama.cpp's vocabulary source. Raises
    RuntimeError when they can be neither found nor downloaded."""
    import fcntl

    tree = CACHE / "tree"
    wanted = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/", MTMD_PHOTO, TEMPLATES,
              LLAMA_VOCAB)  # fmt: skip
    if all((tree / name).exists() for name in wanted):
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:  # one fetch at a time (the suite's workers, two checkouts)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((tree / name).exists() for name in wanted):
            return tree  # another process fetched it while this one waited
        return _extract_tree(tree, wanted)


def _extract_tree(tree: Path, wanted: tuple[str, ...]) -> Path:
    shutil.rmtree(tree, ignore_errors=True)  # an older, smaller extraction
    archive = download_sdist()
    prefix = archive.name.removesuffix(".tar.gz") + "/vendor/llama.cpp/"
    staging = CACHE / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [
            m for m in tar.getmembers() if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(wanted)
        ]
        for m in members:
            m.name = m.name[len(prefix) :]
        tar.extractall(staging, members=members, filter="data")
    staging.rename(tree)
    archive.unlink()
    return tree


def download_sdist(folder: Path = CACHE) -> Path:
    """The source archive into ``folder``, straight from the index's file list (PEP 691
    JSON), its sha256 checked; ``pip download`` (which prepares a build environment
    first: slow) only where that fails. Raises RuntimeError when neither works. Also
    bench/peer_llamacpp.sh's source of llama-server and llama-quantize."""
    import hashlib

    import httpx

    name, version = PACKAGE.split("==")
    filename = f"{name.replace('-', '_')}-{version}.tar.gz"
    try:
        index = httpx.get(
            f"https://pypi.org/simple/{name}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
            timeout=60,
            follow_redirects=True,
        )
        entry = next(f for f in index.raise_for_status().json()["files"] if f["filename"] == filename)
        data = httpx.get(entry["url"], timeout=600, follow_redirects=True).raise_for_status().content
        if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
            raise ValueError(f"{filename}: sha256 mismatch")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / filename).write_bytes(data)
        return folder / filename
    except (httpx.HTTPError, StopIteration, KeyError, ValueError):
        pass
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
        str(folder),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    archives = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        raise RuntimeError(f"cannot download {PACKAGE}: {done.stderr[-500:]}")
    return archives[-1]


def convert(folder: Path, out: Path, outtype: str = "f32", flags: tuple[str, ...] = (), pre: str | None = None) -> Path:
    """``folder`` (a Hugging Face checkpoint) as a GGUF at ``out``, written by llama.cpp's
    converter (``flags``: more of its options, e.g. ``--no-mtp`` for a Qwen3.5 without
    multi-token-prediction layers; ``pre``: the pre-tokenizer name its family's files carry)."""
    return convert_many([(folder, out, outtype)], flags=flags, pre=pre)[0]


def convert_many(
    jobs: list[tuple], processes: int = 2, flags: tuple[str, ...] = (), pre: str | None = None
) -> list[Path]:
    """Several conversions, in ``processes`` interpreters side by side: (source, out,
    type) triples, or (source, out, type, the job's own flags beside ``flags``), or
    (..., its own flags, its pre-tokenizer name beside ``pre``)."""
    runs = []
    for src, out, outtype, *own in jobs:
        args = ["--outfile", str(out), "--outtype", outtype, *flags, *(own[0] if own else ()), str(src)]
        runs.append(("convert_hf_to_gguf.py", args, own[1] if len(own) > 1 else pre))
    _run_converters([runs[i::processes] for i in range(processes) if runs[i::processes]])
    return [job[1] for job in jobs]


def convert_with_lora(base: Path, adapter: Path, base_out: Path, lora_out: Path) -> tuple[Path, Path]:
    """``base`` (a Hugging Face checkpoint) and ``adapter`` (a PEFT folder trained on it)
    as GGUFs, float32, by llama.cpp's convert_hf_to_gguf.py and convert_lora_to_gguf.py,
    in one interpreter."""
    hf = ("convert_hf_to_gguf.py", ["--outfile", str(base_out), "--outtype", "f32", str(base)], None)
    lora_args = ["--base", str(base), "--outfile", str(lora_out), "--outtype", "f32", str(adapter)]
    lora = ("convert_lora_to_gguf.py", lora_args, None)
    _run_converters([[hf, lora]])
    return base_out, lora_out


def gguf_lora_files(root: Path) -> tuple:
    """A tiny llama and a LoRA on it, each also as GGUF: (HF folder, its GGUF, the PEFT
    adapter folder, the adapter as a GGUF LoRA, PEFT's merged model). Fails or skips
    (``unavailable``) where llama.cpp's converters cannot be had."""
    from checkpoints import make_adapter, make_checkpoint
    from unavailable import unavailable

    try:
        converter_tree()
    except RuntimeError as exc:
        unavailable(f"llama.cpp's converters, the GGUF LoRA tests' oracle, cannot be had: {exc}", "SLOTSERVE_SKIP_GGUF")
    folder = make_checkpoint(root / "base", "llama")
    merged = make_adapter(folder, root / "lora", alpha=8.0)
    base_gguf, lora_gguf = convert_with_lora(folder, root / "lora", root / "base.gguf", root / "lora.gguf")
    return folder, base_gguf, root / "lora", lora_gguf, merged


@functools.lru_cache(maxsize=8)
def _reader(path: str, mtime_ns: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def reader_of(path: Path) -> gguf.GGUFReader:
    """gguf-py's reader of ``path``, kept while the file is unchanged: building one parses
    every vocabulary entry (~0.3 s for the demo model's), and the tests derive many files
    from the same source."""
    return _reader(str(path), path.stat().st_mtime_ns)


def write_gguf(src: Path, dst: Path, tensors, overrides: dict | None = None) -> Path:
    """A GGUF with ``src``'s metadata (``overrides`` replacing some values) and
    ``tensors``: (name, array, raw type or None) triples."""
    reader = reader_of(src)
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    overrides = overrides or {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, overrides.pop(field.name, field.contents()), vtype, sub_type=sub)
    for key, value in overrides.items():  # keys the source does not have
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    for name, data, raw_dtype in tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def requantize(
    src: Path,
    dst: Path,
    qtype: gguf.GGMLQuantizationType,
    fallback: gguf.GGMLQuantizationType | None = None,
    experts: bool = False,
) -> Path:
    """``src`` (an F32 GGUF) with its 2-D weights in ``qtype`` (and, with ``experts``, the
    stacked [E, out, in] experts, as llama-quantize writes them). A matrix whose rows are
    not a whole number of ``qtype``'s blocks goes to ``fallback`` (default Q8_0, as
    llama-quantize falls back) where its rows fit that, else stays as it is."""
    from block_packers import pack

    fallback = gguf.GGMLQuantizationType.Q8_0 if fallback is None else fallback

    def tensors():
        for t in reader_of(src).tensors:
            data = np.asarray(t.data)
            rows = data.reshape(-1, data.shape[-1]) if data.ndim == 3 and experts else data
            kind = next((k for k in (qtype, fallback) if rows.ndim == 2 and _fits(rows, k)), None)
            if kind is None:
                yield t.name, data, None
            else:
                yield t.name, pack(rows, kind).reshape(*data.shape[:-1], -1), kind

    return write_gguf(src, dst, list(tensors()))


BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # byte fallback of the raw-UTF-8 alphabets (Gemma 4's)


def write_vocab_gguf(path: Path, name: str, vocab: dict) -> Path:
    """A vocabulary-only GGUF (llama architecture, no tensors: what ``llama-tokenize``
    reads) holding ``vocab`` ({"tokens", "merges", "specials": how many tokens come
    first as control tokens}) under the pre-tokenizer ``name``, as the converter writes
    one: the ``gemma4`` and ``whitespace`` names with their own tokenizer models,
    ``<0xNN>`` byte tokens typed BYTE outside GPT-2's alphabet."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    model = {"gemma4": "gemma4", "whitespace": "whitespace"}.get(name, "gpt2")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(name)
    tokens = vocab["tokens"]
    kinds = []
    for i, t in enumerate(tokens):
        if i < vocab["specials"]:
            kinds.append(gguf.TokenType.CONTROL)
        elif t in BYTE_TOKENS and model != "gpt2":
            kinds.append(gguf.TokenType.BYTE)
        else:
            kinds.append(gguf.TokenType.NORMAL)
    w.add_token_list(tokens)
    w.add_token_types(kinds)
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _fits(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> bool:
    return data.shape[1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0
