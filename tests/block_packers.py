"""Float weights packed into every GGUF block type slotserve keeps, for the tests: the
``gguf`` package's quantizers where it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16,
BF16), plain min/max fits packed here by hand where it has none (the K-quants, IQ4_NL,
IQ4_XS). The packing follows llama.cpp's layouts; what the bytes stand for is always
read back with ``gguf.quants.dequantize``, the oracle, never taken from here.
"""

from __future__ import annotations

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
GGUF_QUANTIZES = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16, T.MXFP4}


def _half(x: np.ndarray) -> np.ndarray:
    """[...] float -> [..., 2] uint8, float16 bytes."""
    return x.astype(np.float16)[..., None].view(np.uint8)


def _fit(x: np.ndarray, levels: int, offset: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per group (last axis): (step, low) with x ~ step * q + low, q in [0, levels)."""
    lo = np.minimum(x.min(-1), 0) if offset else -np.abs(x).max(-1) * (levels // 2) / (levels // 2 - 0.5)
    hi = x.max(-1) if offset else -lo * (levels // 2 - 1) / (levels // 2)
    return (hi - lo) / (levels - 1), lo


def _scaled(step: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Sub-block steps [..., S] -> (super scale d float16-rounded [...], integer scales [..., S])."""
    top = (1 << bits) - 1
    d = (np.abs(step).max(-1) / top).astype(np.float16).astype(np.float32)
    safe = np.where(d > 0, d, 1)[..., None]
    return d, np.clip(np.rint(step / safe), 0 if (step >= 0).all() else -top, top)


def _q(x: np.ndarray, scale: np.ndarray, low: np.ndarray, levels: int) -> np.ndarray:
    safe = np.where(scale != 0, scale, 1)[..., None]
    return np.clip(np.rint((x - low[..., None]) / safe), 0, levels - 1).astype(np.uint8)


def pack_q2_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 16, 16)  # [S, groups, 16]
    step, lo = _fit(x, 4, offset=True)
    d, sc = _scaled(step, 4)
    dmin, m = _scaled(-lo, 4)
    q = _q(x, d[:, None] * sc, -dmin[:, None] * m, 4).reshape(-1, 2, 4, 32)  # [S, half, shift, 32]
    qs = (q << (2 * np.arange(4))[None, None, :, None]).sum(2, dtype=np.uint8)  # [S, 2, 32]
    scales = (sc.astype(np.uint8) | (m.astype(np.uint8) << 4)).reshape(-1, 16)
    return np.concatenate([scales, qs.reshape(-1, 64), _half(d), _half(dmin)], axis=-1)


def pack_q3_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 16, 16)
    step, lo = _fit(x, 8, offset=False)  # q - 4 in [-4, 3]
    d, s = _scaled(step, 5)
    q = _q(x, d[:, None] * s, -4 * d[:, None] * s, 8).reshape(-1, 2, 4, 32)  # [S, half, j, 32]
    shifts = (2 * np.arange(4))[None, None, :, None]
    qs = ((q & 3) << shifts).sum(2, dtype=np.uint8).reshape(-1, 64)
    bits = (np.arange(8).reshape(2, 4))[None, :, :, None]  # hmask bit 4 h + j
    hmask = ((q >> 2) << bits).sum((1, 2), dtype=np.uint8)  # [S, 32]
    sc = (s + 32).astype(np.uint8)  # [S, 16], 6 bits
    packed = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for i in range(16):
        packed[:, i % 8] |= (sc[:, i] & 0x0F) << (4 * (i // 8))
        packed[:, 8 + i % 4] |= (sc[:, i] >> 4) << (2 * (i // 4))
    return np.concatenate([hmask, qs, packed, _half(d)], axis=-1)


def _k4_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    return np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4),
        ],
        axis=-1,
    )


def _pack_k45(w: np.ndarray, bits: int) -> np.ndarray:
    x = w.reshape(-1, 8, 32)
    step, lo = _fit(x, 1 << bits, offset=True)
    d, sc = _scaled(step, 6)
    dmin, m = _scaled(-lo, 6)
    q = _q(x, d[:, None] * sc, -dmin[:, None] * m, 1 << bits).reshape(-1, 4, 2, 32)  # [S, j, pair, 32]
    qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    parts = [_half(d), _half(dmin), _k4_scales(sc, m)]
    if bits == 5:
        shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :])[None, :, :, None]
        parts.append(((q >> 4) << shifts).sum((1, 2), dtype=np.uint8))  # qh [S, 32]
    return np.concatenate(parts + [qs], axis=-1)


def pack_q6_k(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 16, 16)
    step, lo = _fit(x, 64, offset=False)  # q - 32 in [-32, 31]
    d, sc = _scaled(step, 7)
    q = _q(x, d[:, None] * sc, -32 * d[:, None] * sc, 64).reshape(-1, 2, 4, 32)  # [S, half, quarter, 32]
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4), (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], 2)
    qh = ((q >> 4) << (2 * np.arange(4))[None, None, :, None]).sum(2, dtype=np.uint8)  # [S, 2, 32]
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), _half(d)], -1)


def _iq4_index(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    safe = np.where(scale != 0, scale, 1)[..., None]
    return np.abs(x[..., None] / safe[..., None] - IQ4).argmin(-1).astype(np.uint8)


def _signed_max(x: np.ndarray) -> np.ndarray:
    return np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]


def pack_iq4_nl(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 32)
    d = (-_signed_max(x) / 127).astype(np.float16).astype(np.float32)
    idx = _iq4_index(x, d)
    return np.concatenate([_half(d), idx[:, :16] | (idx[:, 16:] << 4)], axis=-1)


def pack_iq4_xs(w: np.ndarray) -> np.ndarray:
    x = w.reshape(-1, 8, 32)
    d, ls = _scaled(-_signed_max(x) / 127, 5)  # ls - 32 in [-31, 31]
    idx = _iq4_index(x, d[:, None] * ls)  # [S, 8, 32]
    ls = (ls + 32).astype(np.uint16)
    scales_h = (((ls >> 4) & 3) << (2 * np.arange(8))).sum(-1, dtype=np.uint16)  # [S]
    scales_l = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)  # [S, 4]
    qs = (idx[:, :, :16] | (idx[:, :, 16:] << 4)).reshape(-1, 128)
    return np.concatenate([_half(d), scales_h[:, None].view(np.uint8), scales_l, qs], axis=-1)


PACKERS = {
    T.Q2_K: pack_q2_k,
    T.Q3_K: pack_q3_k,
    T.Q4_K: lambda w: _pack_k45(w, 4),
    T.Q5_K: lambda w: _pack_k45(w, 5),
    T.Q6_K: pack_q6_k,
    T.IQ4_NL: pack_iq4_nl,
    T.IQ4_XS: pack_iq4_xs,
}


def pack(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """float32 [N, K] -> uint8 [N, row bytes] in ``qtype``'s blocks."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype in GGUF_QUANTIZES:
        return np.ascontiguousarray(gguf.quants.quantize(w, qtype)).view(np.uint8).reshape(w.shape[0], -1)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = PACKERS[qtype](w.reshape(-1, values))  # [N * K / values, size]
    assert blocks.shape[1] == size, (qtype.name, blocks.shape)
    return np.ascontiguousarray(blocks, dtype=np.uint8).reshape(w.shape[0], -1)
