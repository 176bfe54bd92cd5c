"""A GGUF file run by llama.cpp's own library and by slotserve, side by side (issue 66: a
GGUF answers as llama-server on the same file): the logits of every position of a
random token sequence (one batch, teacher-forced), and greedy continuations of a few
prompts (llama.cpp decoding a token at a time).

    python bench/llamacpp_greedy.py FILE.gguf [--folder HF_FOLDER] [--lib DIR] [--sdist DIR] [-n 24]

llama.cpp is the pinned llama-cpp-python sdist's ``libllama`` built as a shared library
(GGML_NATIVE off: AMX instructions fault on these machines), e.g.

    cmake -S SDIST/vendor/llama.cpp -B /tmp/lcpp-shared -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \\
          -DGGML_AVX2=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF
    cmake --build /tmp/lcpp-shared --target llama -j2

driven through the same sdist's ctypes bindings (``--sdist``: the extracted sdist;
they need ``diskcache`` importable), with float32 KV caches and flash attention off.
With ``--folder`` (the folder the file was converted from), transformers' logits on
the folder are printed beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ["def fibonacci(n):", "import os\n\n", "class Stack:\n    def push(self, item):", "The quick brown",
           "Slots keep"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--folder", type=Path)
    ap.add_argument("--lib", default="/tmp/lcpp-shared/bin", help="where libllama.so and libggml*.so are")
    ap.add_argument("--sdist", default="/tmp/lcpp/llama_cpp_python-0.3.36", help="the extracted sdist")
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--positions", type=int, default=90)
    args = ap.parse_args()
    os.environ["LLAMA_CPP_LIB_PATH"] = args.lib
    sys.path.insert(0, args.sdist)
    import llama_cpp
    import numpy as np
    import torch

    from engine import Engine, SamplingParams
    from memory import MemoryBatch

    engine = Engine.from_pretrained(str(args.gguf), n_seq_max=1, cache_type_k="f32", cache_type_v="f32")
    tok = engine.tokenizer
    llm = llama_cpp.Llama(model_path=str(args.gguf), n_ctx=512, n_batch=512, logits_all=True, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False)  # fmt: skip
    torch.manual_seed(0)
    ids = torch.randint(10, engine.model_config.vocab_size, (args.positions,)).tolist()
    llm.eval(ids)
    theirs = torch.tensor(np.array(llm.scores[: len(ids)]))  # [T, V]
    with torch.inference_mode():  # slotserve's model on the whole sequence in one batch, as llama.cpp's
        pos = torch.arange(len(ids))  # [T]
        view = engine.memory.prepare(MemoryBatch([0], [len(ids)], pos))
        ours = engine.model(torch.tensor(ids), pos, view, pos)  # [T, V]
        engine.memory.seq_rm(0, 0)
    print(f"logits of {len(ids)} positions, max |llama.cpp - slotserve|: {float((ours - theirs).abs().max()):.2e}")
    if args.folder:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32).eval()
        with torch.no_grad():
            hf = model(torch.tensor([ids])).logits[0]
        print(f"max |llama.cpp - transformers on the folder|: {float((hf - theirs).abs().max()):.2e}")
    same = 0
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert llm.tokenize(prompt.encode(), add_bos=tok.adds_bos, special=False) == ids, prompt
        want = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=args.n, ignore_eos=True))[0].token_ids
        got = []
        for t in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            got.append(t)
            if len(got) == args.n:
                break
        step = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        same += step is None
        print(f"{prompt!r}: " + ("same" if step is None else f"parts at step {step}"))
    print(f"{same} of {len(PROMPTS)} greedy continuations of {args.n} tokens the same (the prompts' tokens too)")


if __name__ == "__main__":
    main()
