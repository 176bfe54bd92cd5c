"""Random sequences of memory operations on every memory kind that ``build_memory``
makes (sliding-window ring, full-size sliding window, iSWA, layer reuse, recurrent,
hybrid, hybrid iSWA), each under both KV layouts (unified pool, per-stream), against a
plain-Python reference of what each sequence logically holds.

A fake model writes through the forward view: every token has a unique tag; attention
layers store keys (tag, position) and values (tag, tag^2), recurrent layers a state that
is a function of every token consumed (the last two tags; count and a weighted sum).
After every operation:

- an operation that raises or returns False changed nothing (every sequence's saved
  state is bit for bit the same);
- the saved state agrees with the reference: full layers hold exactly the reference's
  cells, a window layer a suffix of them covering its window, a recurrent layer the
  state of exactly the reference's tokens (a cut went back to a real checkpoint);
- the forward's attention reads exactly the cells the reference says are visible
  (zero queries average the visible values), and a reusing layer reads its target's;
- bookkeeping holds (``integrity_check``), and emptying everything leaks nothing.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memory import CacheFull, MemoryBatch
from memory.protocol import StateMismatch
from memory.registry import MemoryConfig, build_memory
from memory.spec import FullAttentionSpec, RecurrentSpec, ReuseSpec, SlidingWindowSpec

N_SEQ = 3
WINDOW = 5
MAX_STEP = 7
F32 = torch.float32
FULL = FullAttentionSpec(n_kv_heads=1, head_dim=2, dtype=F32)
SWA = SlidingWindowSpec(n_kv_heads=1, head_dim=2, dtype=F32, window=WINDOW)
REC = RecurrentSpec(conv_shape=(2,), ssm_shape=(2,), dtype=F32)

# name -> (layer specs, MemoryConfig fields)
KINDS = {
    "sliding": ([SWA], {}),
    "sliding_full": ([SWA, FULL], {"swa_full": True}),
    "iswa": ([FULL, SWA], {}),
    "reuse": ([FULL, ReuseSpec(0)], {}),
    "iswa_reuse": ([FULL, SWA, ReuseSpec(1)], {}),
    "recurrent": ([REC], {}),
    "hybrid": ([FULL, REC], {}),
    "hybrid_iswa": ([FULL, SWA, REC], {}),
}


def shift(layer: int, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    out = k.clone()
    out[:, 0, 1] += delta.to(k.dtype)  # the "rotation" moves the stored position channel
    return out


def build(kind: str, layout: str, n_ctx: int, block_size: int):
    specs, extra = KINDS[kind]
    cfg = MemoryConfig(
        n_ctx=n_ctx,
        n_seq_max=N_SEQ,
        block_size=block_size,
        layout=layout,
        max_step=MAX_STEP,
        n_checkpoints=2,
        ssm_checkpoints=2,
        ssm_checkpoint_every=None,
        **extra,
    )
    return build_memory(specs, cfg, rope_shift=shift), specs


def window(spec) -> int | None:
    return getattr(spec, "window", None)


def visible(ref_seq: list[tuple[int, int]], p: int, win: int | None) -> list[int]:
    return [t for t, q in ref_seq if q <= p and (win is None or q > p - win)]


def expected_state(tokens: list[tuple[int, int]]) -> tuple[list[float], list[float]]:
    conv, ssm = [0.0, 0.0], [0.0, 0.0]
    for tag, pos in tokens:
        conv = [conv[1], float(tag)]
        ssm = [ssm[0] + 1, ssm[1] + tag * (pos + 1)]
    return conv, ssm


def forward(memory, specs, ref, seq: int, n: int, tag0: int) -> None:
    """Append ``n`` tokens to ``seq`` through the view, checking what attention reads."""
    start = memory.seq_pos_max(seq) + 1
    positions = torch.arange(start, start + n)
    view = memory.prepare(MemoryBatch([seq], [n], positions))  # raises: nothing changed
    tags = list(range(tag0, tag0 + n))
    new = list(zip(tags, positions.tolist()))
    after = ref[seq] + new
    t = torch.tensor(tags, dtype=F32)
    k = torch.stack([t, positions.to(F32)], -1)[:, None, :]  # [n, 1, 2]: (tag, position)
    v = torch.stack([t, t * t], -1)[:, None, :]  # [n, 1, 2]: (tag, tag^2)
    outputs = {}
    for layer, spec in enumerate(specs):
        if isinstance(spec, RecurrentSpec):
            conv, ssm = view.states(layer)  # [1, 2] each
            assert expected_state(ref[seq]) == (conv[0].tolist(), ssm[0].tolist())
            conv, ssm = conv[0].tolist(), ssm[0].tolist()
            for tag, pos in new:
                conv = [conv[1], float(tag)]
                ssm = [ssm[0] + 1, ssm[1] + tag * (pos + 1)]
            view.store(layer, torch.tensor([conv]), torch.tensor([ssm]))
            continue
        q = torch.zeros(n, 1, 2)
        if isinstance(spec, ReuseSpec):
            out = view.attend(layer, q, None, None)  # [n, 1, 2]
            assert torch.equal(out, outputs[spec.target]), "a reusing layer reads its target's cache"
            continue
        out = view.attend(layer, q, k, v)  # [n, 1, 2]
        outputs[layer] = out
        for row, p in enumerate(positions.tolist()):
            seen = torch.tensor(visible(after, p, window(spec)), dtype=torch.float64)
            want = torch.stack([seen.mean(), (seen * seen).mean()])
            assert torch.allclose(out[row, 0].double(), want, rtol=1e-4), f"layer {layer} row at {p}"
    ref[seq] = after


def snapshot(memory) -> list:
    out = []
    for s in range(N_SEQ):
        st_ = memory.save_seq(s)
        out.append((st_.positions.clone(), {k: t.clone() for k, t in st_.tensors.items()}, dict(st_.meta)))
    return out


def same(a: list, b: list) -> bool:
    for (pa, ta, ma), (pb, tb, mb) in zip(a, b):
        if not torch.equal(pa, pb) or ta.keys() != tb.keys() or ma != mb:
            return False
        if not all(torch.equal(ta[k], tb[k]) for k in ta):
            return False
    return True


def check_against(memory, specs, ref, kind: str) -> None:
    memory.integrity_check()
    for seq in range(N_SEQ):
        want = ref[seq]
        assert memory.seq_pos_max(seq) == (max(p for _, p in want) if want else -1)
        lo = memory.seq_pos_min(seq)
        assert (lo == -1) == (not want) and lo <= memory.seq_pos_max(seq)
        state = memory.save_seq(seq)
        for layer, spec in enumerate(specs):
            if isinstance(spec, ReuseSpec):
                assert f"k.{layer}" not in state.tensors  # stores nothing of its own
            elif isinstance(spec, RecurrentSpec):
                prefix = "rec." if f"rec.conv.{layer}" in state.tensors else ""
                got = (state.tensors[f"{prefix}conv.{layer}"].tolist(), state.tensors[f"{prefix}ssm.{layer}"].tolist())
                assert got == expected_state(want), f"recurrent layer {layer} of sequence {seq}"
            else:
                ring = window(spec) is not None and "swa.positions" in state.tensors
                pos = state.tensors["swa.positions"] if ring else state.positions
                if kind == "sliding":
                    ring = True
                k = state.tensors[f"k.{layer}"]  # [n, 1, 2]
                assert k[:, 0, 1].long().tolist() == pos.tolist(), "stored keys disagree with cell positions"
                cells = list(zip(k[:, 0, 0].long().tolist(), pos.tolist()))
                if not ring:
                    assert cells == want, f"layer {layer} of sequence {seq}"
                else:  # a window: a suffix of the sequence, at least what the next token needs
                    assert cells == want[len(want) - len(cells) :] and len(cells) >= min(WINDOW - 1, len(want))


class Refused(Exception):
    """An operation the memory declined (returned False)."""


def in_range(p, p0, p1):
    return p >= p0 and (p1 is None or p < p1)


seq_id = st.integers(0, N_SEQ - 1)
at = st.sampled_from(range(101))  # a position, in hundredths of the sequence's length (+ 1 past its end)
end = st.one_of(st.none(), at)
op = st.one_of(
    # sequences grow past the window; a prompt's end is checkpointed (as the engine does) or not
    *(
        st.tuples(st.just("forward"), seq_id, st.integers(1, MAX_STEP), st.integers(1, 4), st.booleans())
        for _ in range(4)
    ),
    st.tuples(st.just("cut"), seq_id, at),
    st.tuples(st.just("rm"), seq_id, at, end),
    st.tuples(st.just("copy"), seq_id, seq_id, at),
    st.tuples(st.just("cp"), seq_id, seq_id, at, end),
    st.tuples(st.just("keep"), seq_id),
    st.tuples(st.just("add"), seq_id, at, end, st.integers(-12, 12)),
    st.tuples(st.just("move"), seq_id, seq_id),
)


def position(memory, seq: int, hundredths: int | None) -> int | None:
    return None if hundredths is None else hundredths * (memory.seq_pos_max(seq) + 2) // 100


def apply(memory, specs, ref, name: str, args: tuple, tag0: int) -> None:
    """One operation on the memory and, where it took effect, on the reference."""
    if name == "forward":
        seq, n, checkpoint = args
        forward(memory, specs, ref, seq, n, tag0)
        if checkpoint:
            memory.checkpoint(seq)
    elif name == "cut":  # back to where the memory says it can cut: that always succeeds
        seq, p = args[0], position(memory, args[0], args[1])
        q = memory.seq_cut_point(seq, p)
        assert 0 <= q <= max(p, 0)
        assert memory.seq_rm(seq, q)
        ref[seq] = [c for c in ref[seq] if c[1] < q]
    elif name == "rm":
        seq, p0, p1 = args[0], position(memory, args[0], args[1]), position(memory, args[0], args[2])
        if not memory.seq_rm(seq, p0, p1):
            raise Refused("seq_rm returned False")
        ref[seq] = [c for c in ref[seq] if not in_range(c[1], p0, p1)]
    elif name == "copy":  # a prefix up to a cut point, as prefix reuse does
        src, dst, p = args[0], args[1], position(memory, args[0], args[2])
        q = memory.seq_cut_point(src, p)
        memory.seq_cp(src, dst, 0, q)
        if src != dst:
            ref[dst] = [c for c in ref[src] if c[1] < q]
    elif name == "cp":
        src, dst, p0, p1 = args[0], args[1], position(memory, args[0], args[2]), position(memory, args[0], args[3])
        memory.seq_cp(src, dst, p0, p1)
        if src != dst:
            ref[dst] = [c for c in ref[src] if in_range(c[1], p0, p1)]
    elif name == "keep":
        memory.seq_keep(args[0])
        ref[:] = [r if s == args[0] else [] for s, r in enumerate(ref)]
    elif name == "add":
        seq, p0, p1, delta = args[0], position(memory, args[0], args[1]), position(memory, args[0], args[2]), args[3]
        memory.seq_add(seq, p0, p1, delta)
        moved = [(t, p + delta if in_range(p, p0, p1) else p) for t, p in ref[seq]]
        ref[seq] = [c for c in moved if c[1] >= 0]
    else:  # "move": save one sequence and load it into another (a slot file's round trip)
        src, dst = args
        memory.load_seq(dst, memory.save_seq(src))
        ref[dst] = list(ref[src])


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    layout=st.sampled_from(["unified", "stream"]),
    ops=st.lists(op, min_size=8, max_size=40),
    block_size=st.sampled_from([1, 4, 16]),
    n_ctx=st.integers(24, 120),
)
def test_every_memory_kind_matches_its_reference(kind, layout, ops, block_size, n_ctx):
    memory, specs = build(kind, layout, n_ctx, block_size)
    ref: list[list[tuple[int, int]]] = [[] for _ in range(N_SEQ)]
    steps = [  # a forward of several steps (a prompt in chunks) checkpoints after its last, if at all
        ("forward", o[1], o[2], o[4] and r == o[3] - 1) if o[0] == "forward" else o
        for o in ops
        for r in range(o[3] if o[0] == "forward" else 1)
    ]
    for i, (name, *args) in enumerate(steps):
        before, ref_before = snapshot(memory), [list(r) for r in ref]
        try:
            apply(memory, specs, ref, name, tuple(args), tag0=16 * i + 1)
        except (Refused, CacheFull, NotImplementedError, StateMismatch, ValueError) as exc:
            if isinstance(exc, NotImplementedError):
                assert name == "add" and not memory.can_shift
            ref[:] = ref_before
            assert same(snapshot(memory), before), f"op {i} {name}{tuple(args)} raised {exc!r} and changed state"
        check_against(memory, specs, ref, kind)
    memory.seq_rm(-1)
    memory.integrity_check()
    assert all(g.n_blocks_used == 0 for g in memory.usage().groups), "storage leaked"
