"""Simple Q4_K and Q6_K block encoders (numpy).

The `gguf` PyPI package can dequantize Q4_K / Q6_K but not quantize them, so these pack blocks in
the exact ggml layout with a plain min/max (Q4_K) and abs-max (Q6_K) scale choice. They do not
reproduce llama.cpp's error-minimising scale search (no need: every reference that uses them is
computed from `gguf.quants.dequantize` of the bytes written here, and the round trip is checked).

ggml layouts (QK_K = 256 values per super-block):
  block_q4_K (144 bytes): d f16 | dmin f16 | scales[12] (8 x 6-bit scale + 8 x 6-bit min) | qs[128]
      value = d * sc[j] * q - dmin * m[j], j = sub-block of 32 (0..7), q in 0..15;
      sub-block 2c uses the low nibbles of qs[32c..32c+32], sub-block 2c+1 the high nibbles;
      scales bytes 0..3: sc[0..3] (bits 0-5) | sc[4..7] bits 4-5 (bits 6-7);
      bytes 4..7: m[0..3] (bits 0-5) | m[4..7] bits 4-5 (bits 6-7);
      bytes 8..11: sc[4..7] bits 0-3 (low nibble) | m[4..7] bits 0-3 (high nibble).
  block_q6_K (210 bytes): ql[128] | qh[64] | scales[16] int8 | d f16
      value = d * scales[s] * (q - 32), s = sub-block of 16 (0..15), q in 0..63;
      element e = 128h + r (h = 0, 1): low 4 bits in ql[64h + r % 64] nibble (r // 64),
      high 2 bits in qh[32h + r % 32] bits 2*(r // 32) .. 2*(r // 32)+1.
"""

import numpy as np

QK_K = 256


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """rows: float32 [..., n] with n % 256 == 0 -> uint8 [..., n // 256 * 144]."""
    rows = np.asarray(rows, dtype=np.float32)
    shape = rows.shape
    x = rows.reshape(-1, 8, 32)  # super-blocks x sub-blocks x values
    nb = x.shape[0]
    mn = np.minimum(x.min(axis=-1), 0.0)  # (nb, 8), <= 0
    mx = x.max(axis=-1)
    scale = (mx - mn) / 15.0  # per sub-block step
    minv = -mn  # >= 0
    d = _f16(scale.max(axis=-1) / 63.0)  # (nb,)
    dmin = _f16(minv.max(axis=-1) / 63.0)
    d32 = d.astype(np.float32)[:, None]
    dm32 = dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(scale / d32), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dm32 > 0, np.rint(minv / dm32), 0).clip(0, 63).astype(np.uint8)
        step = (d32 * sc)[..., None]
        off = (dm32 * m)[..., None]
        q = np.where(step > 0, np.rint((x + off) / step), 0).clip(0, 15).astype(np.uint8)
    scales = np.zeros((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    qs = q.reshape(nb, 4, 2, 32)
    qs = (qs[:, :, 0, :] | (qs[:, :, 1, :] << 4)).reshape(nb, 128)
    out = np.concatenate([d.reshape(nb, 1).view(np.uint8), dmin.reshape(nb, 1).view(np.uint8), scales, qs], axis=1)
    assert out.shape[1] == 144
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """rows: float32 [..., n] with n % 256 == 0 -> uint8 [..., n // 256 * 210]."""
    rows = np.asarray(rows, dtype=np.float32)
    shape = rows.shape
    x = rows.reshape(-1, 16, 16)
    nb = x.shape[0]
    amax = np.abs(x).max(axis=-1)  # (nb, 16)
    scale = amax / 31.0
    d = _f16(scale.max(axis=-1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.rint(scale / d32), 0).clip(-128, 127).astype(np.int8)
        step = (d32 * sc.astype(np.float32))[..., None]
        q = np.where(step != 0, np.rint(x / step), 0).clip(-32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(nb, 2, 128)  # (nb, h, r)
    lo = q & 0x0F
    hi = q >> 4
    ql = (lo[:, :, 0:64] | (lo[:, :, 64:128] << 4)).reshape(nb, 128)
    hi4 = hi.reshape(nb, 2, 4, 32)
    qh = (hi4[:, :, 0] | (hi4[:, :, 1] << 2) | (hi4[:, :, 2] << 4) | (hi4[:, :, 3] << 6)).reshape(nb, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(nb, 1).view(np.uint8)], axis=1)
    assert out.shape[1] == 210
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 210)
