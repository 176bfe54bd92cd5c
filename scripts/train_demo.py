"""Train slotserve's embedded demo model on the Python standard library's sources.

Every machine with CPython has the training text, so the model can be rebuilt anywhere:

    python scripts/train_demo.py --minutes 60 --out engine/demo_model

and a smaller draft for it (speculative decoding, ``-md``), with its tokenizer:

    python scripts/train_demo.py --minutes 8 --hidden 128 --layers 2 --heads 2 --kv-heads 1 --ffn 352 \
        --tokenizer engine/demo_model --out ~/.cache/slotserve-bench/demo-draft

The result is a Hugging Face-layout Llama checkpoint (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json) that slotserve loads
like any other checkpoint. Training uses transformers' LlamaForCausalLM, so the
checkpoint format is the reference one; transformers is a test/dev dependency only.

Held-out files: every stdlib file whose path hashes to 0 mod 20 is kept out of
training and used for the reported held-out loss.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sysconfig
import time
from pathlib import Path

import torch

EOS = "<|endoftext|>"
SPECIALS = [EOS, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SKIP_DIRS = {"site-packages", "__pycache__", "idlelib", "turtledemo", "ensurepip"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        files += [Path(d) / n for n in sorted(names) if n.endswith(".py")]
    return files


def is_heldout(path: Path) -> bool:
    digest = hashlib.sha256(str(path.name + path.parent.name).encode()).digest()
    return digest[0] % 20 == 0


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def encode_all(tok, texts: list[str]) -> torch.Tensor:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids += enc.ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


def batches(data: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        # transformers shifts labels inside the loss: labels are the inputs themselves
        yield torch.stack([data[s : s + seq] for s in starts.tolist()])


@torch.no_grad()
def eval_loss(model, data: torch.Tensor, seq: int, n_windows: int = 64) -> float:
    model.eval()
    losses = []
    step = max(1, (len(data) - seq - 1) // n_windows)
    for s in range(0, len(data) - seq - 1, step)[:n_windows]:
        x = data[s : s + seq][None]
        out = model(input_ids=x, labels=x, use_cache=False)
        losses.append(float(out.loss))
    model.train()
    return sum(losses) / len(losses)


def lr_at(frac: float, peak: float, warm: float = 0.03) -> float:
    if frac < warm:
        return peak * frac / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - warm) / (1 - warm)))))


def write_tokenizer_files(tok, out: Path, ctx: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "model_max_length": ctx,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="engine/demo_model")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--tokenizer", type=Path, help="a trained model's folder whose tokenizer.json to use (a draft model: the same)"
    )
    args = ap.parse_args()

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = stdlib_files()
    train_files = [f for f in files if not is_heldout(f)]
    held_files = [f for f in files if is_heldout(f)]
    train_texts, held_texts = read_texts(train_files), read_texts(held_files)
    print(f"files: {len(train_texts)} train, {len(held_texts)} held out", flush=True)

    if args.tokenizer is not None:  # a draft for the demo model speaks its tokens
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    else:
        tok = train_tokenizer(train_texts, args.vocab)
    train_ids, held_ids = encode_all(tok, train_texts), encode_all(tok, held_texts)
    print(f"tokens: {len(train_ids):,} train, {len(held_ids):,} held out", flush=True)
    eos = tok.token_to_id(EOS)

    ctx = 4 * args.seq
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=ctx,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params:,}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    budget = args.minutes * 60
    t0 = time.monotonic()
    step = 0
    for x in batches(train_ids, args.batch, args.seq, gen):
        frac = (time.monotonic() - t0) / budget
        if frac >= 1:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(frac, args.lr)
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step} frac {frac:.2f} loss {loss.item():.3f}", flush=True)

    held = eval_loss(model, held_ids, args.seq)
    tokens_seen = step * args.batch * args.seq
    print(f"done: {step} steps, {tokens_seen:,} tokens, held-out loss {held:.3f}", flush=True)
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=eos, eos_token_id=eos).save_pretrained(out)
    write_tokenizer_files(tok, out, ctx)
    report = {
        "parameters": n_params,
        "steps": step,
        "tokens_seen": tokens_seen,
        "train_tokens": len(train_ids),
        "heldout_tokens": len(held_ids),
        "heldout_loss": round(held, 4),
        "minutes": args.minutes,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
