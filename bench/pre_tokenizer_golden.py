"""Golden tokens from llama.cpp itself, for every pre-tokenizer name the pinned
llama.cpp knows (engine/text/splits.py has one entry per name).

    python bench/pre_tokenizer_golden.py [--llama-tokenize PATH] [--out tests/data/pre_tokenizers.json]

For each distinct split, a small byte-pair vocabulary is trained with that split (the
``tokenizers`` trainer over the corpus below and a paragraph of prose, so the corpus's
words merge far); for each name, a GGUF file holding that vocabulary under that
``tokenizer.ggml.pre`` is written with gguf-py (a vocabulary-only file, as
``llama-tokenize`` reads it) and the corpus is tokenized by the pinned llama.cpp's
``llama-tokenize`` (special tokens parsed, no BOS, no escapes). The vocabularies, the
corpus and llama.cpp's ids go into one JSON file that tests/test_pre_tokenizers.py
reads: the tests compare slotserve's tokens with these and with transformers on the
same vocabulary as a Hugging Face folder.

``llama-tokenize`` is built from the llama-cpp-python sdist tests/gguf_tools.py pins,
into ``$SLOTSERVE_PEER_CACHE`` (default ~/.cache/slotserve-peer), with GGML_NATIVE off:
tokenizing needs no fast kernels, and a native build emits AMX where a CPU lists it
(these VMs fault on it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gguf_tools import BYTE_TOKENS, write_vocab_gguf  # noqa: E402

from engine.text.splits import SPLITS, Split  # noqa: E402

CACHE = Path(os.environ.get("SLOTSERVE_PEER_CACHE", Path.home() / ".cache" / "slotserve-peer"))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 900

CORPUS = [
    "def fib(n):\n    if n < 2:\n        return n\n\treturn fib(n - 1) + fib(n-2)  # O(2^n)\r\n",
    "Call 5551234567 or +1 (555) 123-4567; pay 1,234,567.89 by 2026-12-07T13:42:00Z; x=123456789012",
    "你好，世界！今天是2026年12月7日。日本語のテキスト、カタカナとひらがな。한국어 문장입니다.",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ สวัสดีครับ ๑๒๓",
    "नमस्ते दुनिया, यह हिन्दी है। क्षत्रिय ज्ञान १२३",
    "Family: 👨\u200d👩\u200d👧\u200d👦 flags 🇫🇷🇯🇵 thumbs 👍🏽 heart ❤️ ok 🙂🙂",
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301 beside Café naïve résumé; Z\u0351\u0357a\u0310l\u0308g\u0352o",
    "I'LL SAY IT'S FINE, YOU'RE RIGHT; they'll've done it; 'S 'll 'Re THEY'D WE'VE",
    "a  b   c\t\td    \n\n\n   e \u00a0 f\u3000g\u2003h     ",
    "line one\r\nline two\r\n\r\nline three\r\n\r\n",
    "<|im_start|>user\nhi<|im_end|> <s> </s> [INST] <|endoftext|><|endoftext|> <sentinel:12> IMGIMGABZ <|im_end",
    "HTTPServerError camelCaseWord XMLHttpRequest iPhone McDonald's ALLCAPS lowercase MiXeD",
    "مرحبا بالعالم، كيف حالك؟ ۔ اردو میں",
    "Ελληνικά και русский язык: Привет, мир! Ёжик.",
    "   leading and trailing   ",
    "Wait...!?!? (yes) [no] {maybe} <tag/> a->b => c != d && e || f ... ``` ~~~ $x+y^2 | z",
    "https://example.com/a/b?c=1&d=2#frag /usr/local/bin C:\\Windows\\System32 foo_bar-baz.qux",
    "١٢٣٤٥ ٦٧٨ ໑໒໓ ①②③ ½ ٣.١٤",
    "ｶﾀｶﾅ ﾃｽﾄ ＡＢＣ１２３ ㈱ ﬁ ﬂ",
    "x",
]
PROSE = (
    "The quick brown fox jumps over the lazy dog. Slots keep sessions warm; a prefix copy is metadata only. "
    "Numbers like 42, 3.14159 and 1000000 appear in text, as do words in CAPS and in camelCase. "
    "return value; if else while for import from class self def lambda yield await async"
)


def groups() -> dict[int, tuple[Split, list[str]]]:
    """The names of each distinct split (aliases share one vocabulary)."""
    found: dict[int, tuple[Split, list[str]]] = {}
    for name, split in SPLITS.items():
        found.setdefault(id(split), (split, []))[1].append(name)
    return found


def whole_words(tok, vocab: set[str], n: int = 48) -> list[str]:
    """Words of the corpus (pieces of the split) no merge makes: what ``ignore_merges``
    keeps whole (Llama 3's vocabulary has many) and a plain BPE cuts."""
    words = []
    for text in CORPUS:
        normal = tok.normalizer.normalize_str(text) if tok.normalizer else text
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(normal):
            if len(piece) >= 4 and piece not in vocab and piece not in words:
                words.append(piece)
    return words[:n]


def train(split: Split) -> dict:
    """A vocabulary trained with ``split``: {"tokens": [...], "merges": [...], "specials": n}."""
    from family_tokenizers import untrained
    from tokenizers import pre_tokenizers, trainers

    tok = untrained(split)
    alphabet = pre_tokenizers.ByteLevel.alphabet() if split.alphabet == "bytes" else []
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator([*CORPUS, PROSE] * 3, trainer)
    trained = json.loads(tok.to_str())["model"]
    tokens = sorted(trained["vocab"], key=trained["vocab"].get)
    tokens += whole_words(tok, set(tokens))
    if split.alphabet != "bytes":
        tokens += [b for b in BYTE_TOKENS if b not in trained["vocab"]]
    merges = [m if isinstance(m, str) else " ".join(m) for m in trained["merges"]]
    return {"tokens": tokens, "merges": merges, "specials": len(SPECIALS)}


def llama_tokenize(binary: Path, gguf_path: Path, text: str, scratch: Path) -> list[int]:
    prompt = scratch / "prompt.txt"
    prompt.write_bytes(text.encode("utf-8"))
    cmd = [str(binary), "-m", str(gguf_path), "-f", str(prompt), "--ids", "--no-bos", "--no-escape", "--log-disable"]
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{gguf_path.name}: llama-tokenize failed: {done.stderr.decode()[-800:]}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def build_llama_tokenize() -> Path:
    """llama-tokenize from the pinned sdist (built once into CACHE)."""
    binary = CACHE / "llama-tokenize"
    if binary.exists():
        return binary
    from gguf_tools import download_sdist

    archive = download_sdist(CACHE / "src")
    subprocess.run(["tar", "xzf", str(archive), "-C", str(CACHE)], check=True)
    tree = next(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))
    build = CACHE / "build-tokenize"
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
             "-DBUILD_SHARED_LIBS=OFF"]  # fmt: skip
    subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *flags], check=True)
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-tokenize", "-j", str(os.cpu_count())], check=True
    )
    (build / "bin" / "llama-tokenize").rename(binary)
    return binary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-tokenize", type=Path, help="an existing llama-tokenize of the pinned llama.cpp")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "pre_tokenizers.json")
    args = ap.parse_args()
    binary = args.llama_tokenize or build_llama_tokenize()
    vocabs, names = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for split, aliases in groups().values():
            key = aliases[0]
            vocabs[key] = train(split)
            for name in aliases:
                path = write_vocab_gguf(scratch / f"{name}.gguf", name, vocabs[key])
                names[name] = {"vocab": key, "ids": [llama_tokenize(binary, path, t, scratch) for t in CORPUS]}
                print(f"{name:28s} {sum(map(len, names[name]['ids'])):5d} tokens", flush=True)
    record = {"llama_cpp": "llama-cpp-python==0.3.36 (vendor/llama.cpp)", "corpus": CORPUS, "vocabs": vocabs,
              "names": names}  # fmt: skip
    args.out.write_text(json.dumps(record, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
    print(f"{len(names)} names, {len(vocabs)} vocabularies -> {args.out}")


if __name__ == "__main__":
    main()
