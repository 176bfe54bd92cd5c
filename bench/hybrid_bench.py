"""Recurrent and hybrid memory: what a slot costs, and what checkpoints buy.

    python bench/hybrid_bench.py                 # all three parts
    python bench/hybrid_bench.py --part memory   # memory | followup | spacing

- memory: bytes per slot at 8k context, from the memory specs, for a Granite-4-hybrid
  shaped model (40 layers, 4 of them attention) and an attention-only model of the same
  width (every layer attention), float32 and bfloat16.
- followup: a follow-up turn that re-renders the end of the last answer differently
  (the common case of chat templates), with checkpoints (the defaults) and without
  (--ssm-checkpoints 0): time to first token and tokens recomputed, at prompt lengths
  64, 256, 1024, 4096, on a small random Granite-hybrid checkpoint (engine, offline).
- spacing: checkpoint spacing against memory and recompute for a follow-up that
  diverges at a random point of a 4096-token prompt.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

GRANITE_SHAPE = dict(  # Granite-4-hybrid shaped: mostly Mamba2, an attention layer every 10th
    hidden=1536, layers=40, attn_every=10, heads=12, kv_heads=4, head_dim=128, m_heads=48, m_head_dim=64, state=128
)
SMALL = dict(  # the followup/spacing checkpoint: small enough for this CPU
    hidden_size=256,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    layer_types=["mamba", "mamba", "mamba", "attention"] * 2,
    mamba_n_heads=8,
    mamba_d_head=64,
    mamba_d_state=64,
    mamba_n_groups=1,
    mamba_chunk_size=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    shared_intermediate_size=256,
    position_embedding_type=None,
    vocab_size=320,
    max_position_embeddings=8192,
)


def part_memory() -> dict:
    """Bytes per slot of the Granite-4-shaped hybrid and of the same model with attention
    in every layer, float32 and bfloat16 (printed; returned for bench/plot.py)."""
    from memory import FullAttentionSpec, RecurrentSpec
    from memory.registry import cache_bytes

    g, n_ctx = GRANITE_SHAPE, 8192
    out = {"n_ctx": n_ctx}
    print(f"\nmemory per slot at {n_ctx} tokens (from the memory specs)")
    print(f"{'dtype':>9} {'hybrid MiB':>11} {'of which states':>16} {'attention-only MiB':>19} {'ratio':>7}")
    for dtype in (torch.float32, torch.bfloat16):
        attn = FullAttentionSpec(g["kv_heads"], g["head_dim"], dtype)
        conv_dim = g["m_heads"] * g["m_head_dim"] + 2 * g["state"]
        rec = RecurrentSpec((conv_dim, 3), (g["m_heads"], g["m_head_dim"], g["state"]), dtype)
        hybrid = [attn if (i + 1) % g["attn_every"] == 0 else rec for i in range(g["layers"])]
        dense = [attn] * g["layers"]
        h, d = cache_bytes(hybrid, n_ctx), cache_bytes(dense, n_ctx)
        states = sum(s.bytes_per_seq for s in hybrid if isinstance(s, RecurrentSpec))
        name = str(dtype).split(".")[1]
        print(f"{name:>9} {h / 2**20:>11.1f} {states / 2**20:>16.1f} {d / 2**20:>19.1f} {h / d:>7.3f}")
        print(f"{'':>9} one checkpoint costs {states / 2**20:.1f} MiB (the recurrent states once more)")
        out[name] = {"hybrid": h, "states": states, "attention_only": d}
    return out


def make_small(folder: Path) -> Path:
    from checkpoints import make_checkpoint

    return make_checkpoint(folder, "granitemoehybrid", **SMALL)


def first_token_time(engine, prompt: list[int], slot: int, n_cached: int) -> tuple[float, int]:
    """(seconds to the first sampled token, the prompt tokens recomputed)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    seq = engine.add_sequence(prompt, params, seq_id=slot, n_cached=n_cached)
    start = seq.n_computed
    while engine.has_work:
        engine.step()
    return time.perf_counter() - t0, len(prompt) - start


def turn(engine, prompt: list[int], slot: int, n_new: int) -> list[int]:
    from engine import SamplingParams

    seq = engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True), seq_id=slot)
    while engine.has_work:
        engine.step()
    return seq.output_ids


def part_followup(folder: Path) -> None:
    from engine import Engine

    print("\nfollow-up turn (answer's last 3 tokens re-rendered, 16 new tokens): TTFT and tokens recomputed")
    print(f"{'prompt':>7} {'with ckpt ms':>13} {'recomputed':>11} {'without ms':>11} {'recomputed':>11} {'speedup':>8}")
    rng = random.Random(0)
    for n in (64, 256, 1024, 4096):
        row = []
        for n_ckpt in (4, 0):
            engine = Engine.from_pretrained(str(folder), n_ctx=16384, n_seq_max=2, ssm_checkpoints=n_ckpt)
            prompt = [rng.randrange(1, 300) for _ in range(n)]
            answer = turn(engine, prompt, 0, 24)
            follow = prompt + answer[:-3] + [rng.randrange(1, 300) for _ in range(19)]
            common = len(prompt) + len(answer) - 3
            row.append(first_token_time(engine, follow, 0, common))
        (tw, rw), (to, ro) = row
        print(f"{n:>7} {tw * 1e3:>13.0f} {rw:>11} {to * 1e3:>11.0f} {ro:>11} {to / tw:>7.1f}x")


def part_spacing(folder: Path) -> None:
    from engine import Engine

    n, trials = 4096, 6
    print(f"\ncheckpoint spacing: a {n}-token prompt, follow-ups diverging at {trials} random points")
    print(f"{'spacing':>8} {'prefill s':>10} {'ckpts kept':>11} {'mean recomputed':>16} {'mean TTFT ms':>13}")
    rng = random.Random(1)
    prompt = [rng.randrange(1, 300) for _ in range(n)]
    points = [rng.randrange(n // 2, n) for _ in range(trials)]  # the divergence falls in the last half
    for every in (128, 512, 2048, 8192):
        engine = Engine.from_pretrained(
            str(folder), n_ctx=16384, n_seq_max=2, ssm_checkpoint_every=every, ssm_checkpoints=n // every + 1
        )
        t0 = time.perf_counter()
        turn(engine, prompt, 0, 1)
        prefill = time.perf_counter() - t0
        kept = len(engine.memory.checkpoints(0))
        times, recomputed = [], []
        for p in points:
            engine.memory.seq_rm(1)
            engine.memory.seq_cp(0, 1)
            follow = prompt[:p] + [rng.randrange(1, 300) for _ in range(16)]
            dt, r = first_token_time(engine, follow, 1, p)
            times.append(dt)
            recomputed.append(r)
        mean_r, mean_t = sum(recomputed) / trials, sum(times) / trials * 1e3
        print(f"{every:>8} {prefill:>10.2f} {kept:>11} {mean_r:>16.0f} {mean_t:>13.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["memory", "followup", "spacing", "all"], default="all")
    args = ap.parse_args()
    print(f"torch threads {torch.get_num_threads()}")
    if args.part in ("memory", "all"):
        part_memory()
    if args.part in ("followup", "spacing", "all"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = make_small(Path(tmp) / "granite")
            if args.part in ("followup", "all"):
                part_followup(folder)
            if args.part in ("spacing", "all"):
                part_spacing(folder)


if __name__ == "__main__":
    main()
