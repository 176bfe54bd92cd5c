"""Engine decode throughput on a CUDA device, against the floor (bench/gpu_check.sh runs it).

    python bench/gpu_bench.py --out DIR --model DIR [--batches 1,8,32,64] [--prompt 512] [--new 128]

The checkpoint is issue 40's: a random 1.1B Llama shape in bfloat16 (hidden 2048, 16
layers, 32/8 heads, FFN 8192, vocab 32000), built on the GPU. For each decode mode
(captured graphs, the static step eager, the general path) and batch size: prompts of
--prompt random tokens, --new greedy tokens each; decode tok/s is measured from the
first sampled token to the last (prefill apart). The floor of one decode step: the
bytes it must read (weights other than the embedding table, plus every row's KV) over
the measured bandwidth of a device-to-device copy (bytes read + written / time: the
issue's floor). Also: kernel launches per decode step (the
profiler's count), and each static step's profile (written to --out). The "general" mode
is the engine as issue 40 found it; "graphs_torch" captures torch's small ops instead of
engine/kernels/triton_ops.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from engine_bench import ONE_B  # noqa: E402

SHAPE = dict(ONE_B, vocab_size=32000)  # engine_bench's ~1B Llama shape with issue 40's vocabulary
MODES = {  # name -> (engine overrides, the small ops in Triton: engine/kernels/cuda_ops.py)
    "graphs": (dict(static_decode=True, enforce_eager=False), True),
    "graphs_torch": (dict(static_decode=True, enforce_eager=False), False),  # graphs of torch's small ops
    "static_eager": (dict(static_decode=True, enforce_eager=True), True),
    "general": (dict(static_decode=False), True),  # the engine as issue 40 found it (the general path)
}


def build(folder: Path) -> None:
    import transformers
    from checkpoints import write_byte_tokenizer

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE)).to(torch.bfloat16)
    model.save_pretrained(folder)
    write_byte_tokenizer(folder)
    del model
    torch.cuda.empty_cache()


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, read + written counted."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * 20 / (start.elapsed_time(end) / 1e3)


def decode_run(engine, batch: int, n_prompt: int, n_new: int, seed: int) -> dict:
    """Prefill ``batch`` random prompts, then time the decode steps."""
    from engine import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
    for i in range(batch):
        engine.memory.seq_rm(i)
        engine.add_sequence(torch.randint(1, SHAPE["vocab_size"], (n_prompt,), generator=gen).tolist(), params, i)
    t0 = time.perf_counter()
    while any(not s.output_ids for s in engine.running):
        engine.step()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    steps = 0
    while engine.has_work:
        engine.step()
        steps += 1
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_steps": steps, "step_ms": (t2 - t1) / steps * 1e3,
            "tok_s": batch * steps / (t2 - t1)}  # fmt: skip


def launches_per_step(engine, batch: int, out: Path | None) -> int:
    """Kernels the profiler sees in one decode step of ``batch`` rows (after warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for i in range(batch):
        engine.memory.seq_rm(i)
        engine.add_sequence(list(range(1, 65)), params, i)
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    while engine.has_work:
        engine.step()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if out is not None:
        out.write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
    return len(kernels)


def replay_ms(engine, batch: int) -> float:
    """GPU time of one captured step replayed alone (no host work between replays)."""
    static = engine.static
    size = static.size_for(batch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    static.graphs.replay(size)
    start.record()
    for _ in range(50):
        static.graphs.replay(size)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True, help="checkpoint folder (issue 40's is built there if absent)")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--modes", default="graphs,graphs_torch,static_eager,general")
    args = ap.parse_args()
    from engine import Engine
    from engine.kernels import cuda_ops

    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.model
    if not (folder / "config.json").exists():
        build(folder)
    batches = [int(b) for b in args.batches.split(",")]
    bandwidth = copy_bandwidth()
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_GBps": bandwidth / 1e9, "runs": []}
    print(f"GPU {report['gpu']}, torch {torch.__version__}, device copy {bandwidth / 1e9:.0f} GB/s (read + written)")
    for mode in args.modes.split(","):
        n_max = max(batches)
        overrides, cuda_ops.enabled = MODES[mode]
        t0 = time.perf_counter()
        engine = Engine.from_pretrained(
            str(folder), n_ctx=n_max * (args.prompt + args.new + 16), n_seq_max=n_max, kv_unified=False,
            max_batch_tokens=4096, device="cuda", **overrides,
        )  # fmt: skip
        load_s = time.perf_counter() - t0
        weights = sum(engine.weight_bytes.values()) - SHAPE["vocab_size"] * SHAPE["hidden_size"] * 2  # no embedding
        head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
        per_token_kv = SHAPE["num_hidden_layers"] * 2 * SHAPE["num_key_value_heads"] * head_dim * 2  # K and V, bf16
        for batch in batches:
            decode_run(engine, batch, 32, 4, seed=batch)  # warm-up at this size
            run = decode_run(engine, batch, args.prompt, args.new, seed=batch)
            kv = batch * (args.prompt + args.new / 2) * per_token_kv  # mean KV read per step
            floor_ms = (weights + kv) / bandwidth * 1e3  # read at the copy's rate (its bytes read + written)
            run.update(mode=mode, batch=batch, load_s=load_s, floor_ms=floor_ms, floor_tok_s=batch / floor_ms * 1e3)
            run["x_floor"] = run["step_ms"] / floor_ms
            if batch in (1, max(batches)):
                prof = args.out / f"profile-{mode}-b{batch}.txt"
                run["kernels_per_step"] = launches_per_step(engine, batch, prof if mode != "general" else None)
                if engine.static is not None and engine.static.graphs is not None:
                    run["replay_ms"] = replay_ms(engine, batch)
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
        del engine
        torch.cuda.empty_cache()
    (args.out / "gpu_bench.json").write_text(json.dumps(report, indent=1))
    print(f"\n{'mode':<13}{'batch':>6}{'step ms':>9}{'floor ms':>9}{'x floor':>8}{'tok/s':>9}{'kernels':>8}")
    for r in report["runs"]:
        print(
            f"{r['mode']:<13}{r['batch']:>6}{r['step_ms']:>9.2f}{r['floor_ms']:>9.2f}{r['x_floor']:>8.1f}"
            f"{r['tok_s']:>9.0f}{r.get('kernels_per_step', ''):>8}"
            + (f"  replay {r['replay_ms']:.2f} ms" if "replay_ms" in r else "")
        )


if __name__ == "__main__":
    main()
