"""An image prompt's encode + prefill, through a server's /completion (llama-server's
prompt object: text with ``<__media__>`` and base64 images), and a follow-up on the
same image. Works against slotserve and llama-server alike (bench/vision_peer.sh).

    python bench/vision_bench.py build FOLDER [--family gemma3|qwen35]   # the bench checkpoint (below)
    python bench/vision_bench.py run URL [--n 5]                          # one JSON line of figures

The checkpoint (``gemma3``, the default): a random Gemma 3 vision-language model with
the ~1B language model of bench/engine_bench.py's ``1b`` shape (hidden 2048, 16 layers,
32/8 heads of 64, FFN 8192, vocabulary 32,000; five sliding layers to a global one, as
Gemma 3) and a SigLIP-B/14 encoder at 224 px (12 layers, 768 wide, 256 patches) pooled
to 64 image tokens; a SentencePiece tokenizer with Gemma 3's image markers.

``qwen35`` (issue 52): a random Qwen3.5 with images, the ~1.2B dense language model of
bench/hybrid_models.py (Gated DeltaNet and gated attention, 3:1) and Qwen3.5's own vision
tower shape (27 blocks, 1152 wide, 16 heads, FFN 4304, 16-pixel patches, a 48 x 48
position table; ~0.4B), the demo model's byte-level tokenizer with Qwen's vision tokens
added. A 640 x 480 image is 40 x 30 patches, 300 tokens, in both servers.

Each measured request sends a new image (no encoder or prefix cache can answer it), a
640 x 480 PNG the servers resize, with ``n_predict`` 1: its wall time is the image's
decode + preprocessing + encode + the prompt's prefill + one token. The follow-up
repeats the prompt with more text after the image: a server that keeps the image's KV
computes only the new tokens (``timings.prompt_n``).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

MARKERS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
QUESTION = "Describe this picture: <__media__> in one word."


def build(folder: Path) -> None:
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from checkpoints import write_spm_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    write_spm_tokenizer(folder, 1000, MARKERS)
    added = json.loads((folder / "added_tokens.json").read_text())
    layers = (["sliding_attention"] * 5 + ["full_attention"]) * 2 + ["sliding_attention"] * 4  # every 6th global
    text = dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, query_pre_attn_scalar=64, max_position_embeddings=8192,
        sliding_window=512, layer_types=layers,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                  image_size=224, patch_size=14)  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=64, image_token_index=added[MARKERS[1]],
        boi_token_index=added[MARKERS[0]], eoi_token_index=added[MARKERS[2]],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    model.save_pretrained(folder)
    from safetensors.torch import load_file, save_file

    for shard in folder.glob("*.safetensors"):  # the encoder under vision_tower.vision_model., as Gemma 3's releases
        weights = load_file(shard)
        moved = {("vision_tower.vision_model." + k[13:] if k.startswith("vision_tower.") else k): v
                 for k, v in weights.items()}  # fmt: skip
        save_file(moved, shard, metadata={"format": "pt"})
    processor = {"image_processor_type": "Gemma3ImageProcessor", "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
                 "size": {"height": 224, "width": 224}, "image_seq_length": 64, "resample": 2,
                 "rescale_factor": 1 / 255, "do_normalize": True, "do_rescale": True, "do_resize": True}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))


QWEN_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def build_qwen35(folder: Path) -> None:
    import shutil

    import torch
    import transformers
    from tokenizers import Tokenizer

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "bench"))
    from hybrid_models import SHAPES

    from engine import DEMO_MODEL

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(DEMO_MODEL / "tokenizer.json"))
    tok.add_special_tokens(QWEN_TOKENS)
    tok.save(str(folder / "tokenizer.json"))
    shutil.copy(DEMO_MODEL / "tokenizer_config.json", folder / "tokenizer_config.json")
    start, image, end = (tok.token_to_id(t) for t in QWEN_TOKENS)
    text = dict(SHAPES["dense"][1])
    text["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)]
    del text["full_attention_interval"]
    vision = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                  out_hidden_size=text["hidden_size"])  # fmt: skip
    config = transformers.Qwen3_5Config(
        text_config=text, vision_config=vision, image_token_id=image, vision_start_token_id=start,
        vision_end_token_id=end, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():  # random, scaled as an initializer would (no slow init pass)
        for n, p in model.named_parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(0.0 if n.endswith(("norm.weight", "A_log")) else 1.0)
    model.save_pretrained(folder)
    print(f"qwen35: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", file=sys.stderr)
    processor = {"image_processor_type": "Qwen2VLImageProcessor", "size": {"shortest_edge": 65536,
                 "longest_edge": 16777216}, "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                 "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))


def png(seed: int) -> str:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def ask(url: str, text: str, image: str) -> tuple[float, dict]:
    import httpx

    body = {"prompt": {"prompt_string": text, "multimodal_data": [image]}, "n_predict": 1, "temperature": 0,
            "cache_prompt": True, "id_slot": 0}  # fmt: skip
    t0 = time.perf_counter()
    r = httpx.post(url + "/completion", json=body, timeout=600)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    return wall, r.json()


def run(url: str, n: int) -> dict:
    ask(url, QUESTION, png(10_000))  # warm-up: the first image pays one-time costs in both servers
    walls, prompt_ms, n_prompt = [], [], []
    for i in range(n):
        wall, answer = ask(url, QUESTION, png(i))
        walls.append(wall)
        prompt_ms.append(answer.get("timings", {}).get("prompt_ms"))
        n_prompt.append(answer.get("tokens_evaluated"))
    image = png(n - 1)  # the last image, whose KV the slot holds
    wall_follow, follow = ask(url, QUESTION + " And what colour dominates it, in more words than one?", image)
    return {
        "url": url,
        "n": n,
        "wall_ms_median": 1000 * statistics.median(walls),
        "wall_ms": [round(1000 * w, 1) for w in walls],
        "prompt_ms": prompt_ms,
        "tokens_evaluated": n_prompt[-1],
        "follow_up_wall_ms": round(1000 * wall_follow, 1),
        "follow_up_prompt_n": follow.get("timings", {}).get("prompt_n"),
        "follow_up_tokens_evaluated": follow.get("tokens_evaluated"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("folder", type=Path)
    b.add_argument("--family", choices=("gemma3", "qwen35"), default="gemma3")
    r = sub.add_parser("run")
    r.add_argument("url")
    r.add_argument("--n", type=int, default=5)
    args = parser.parse_args()
    if args.cmd == "build":
        (build_qwen35 if args.family == "qwen35" else build)(args.folder)
    else:
        print(json.dumps(run(args.url, args.n)))


if __name__ == "__main__":
    main()
