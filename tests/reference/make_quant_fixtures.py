"""Decoded quantized blocks from gguf-py, the engine's independent check of its block decoder.

For every block type of llama.cpp's quantization presets this writes a few blocks of seeded
random bytes and the float32 values `gguf.quants.dequantize` (llama.cpp's own Python package)
decodes from them, into `engine/tests/fixtures/quant_blocks.json`. `engine/tests/quant_decode.rs`
decodes the same bytes with `slotlight_engine::model::weights::dequantize` and requires the same
bits, without Python.

Random bytes can make NaN or infinite f16 scales, so every f16 field is overwritten: in all but
the last block of a type with a moderate value (scales in [-0.1, 0.1], K-quant `dmin` in
[0, 0.1], Q4_1/Q5_1 minimum in [-0.1, 0.1]); in the last block with a random finite half over
the whole f16 range (subnormals and large exponents included). Every other byte (codes, high
bits, packed sub-block scales) stays random.

Usage (from the repository root, with `gguf` and `numpy` in a virtualenv outside the repo):
    VENV/bin/python tests/reference/make_quant_fixtures.py
"""

import json
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

SEED = 20
OUT = Path(__file__).resolve().parents[2] / "engine" / "tests" / "fixtures" / "quant_blocks.json"

# name -> (byte offsets of the f16 scale fields, offsets of the f16 fields that are a K-quant
# `dmin` (non-negative in llama.cpp's files), blocks to write)
TYPES = {
    "Q4_0": ([0], [], 12),
    "Q4_1": ([0, 2], [], 12),
    "Q5_0": ([0], [], 12),
    "Q5_1": ([0, 2], [], 12),
    "Q8_0": ([0], [], 12),
    "Q2_K": ([80, 82], [82], 4),
    "Q3_K": ([108], [], 4),
    "Q4_K": ([0, 2], [2], 4),
    "Q5_K": ([0, 2], [2], 4),
    "Q6_K": ([208], [], 4),
    "IQ4_NL": ([0], [], 12),
    "IQ4_XS": ([0], [], 4),
}


def random_finite_half(rng: np.random.Generator) -> np.float16:
    while True:
        h = np.array([rng.integers(0, 1 << 16)], dtype=np.uint16).view(np.float16)[0]
        if np.isfinite(h):
            return h


def main() -> None:
    rng = np.random.default_rng(SEED)
    out = {
        "generator": "tests/reference/make_quant_fixtures.py",
        "library_versions": {"gguf": getattr(gguf, "__version__", None) or _gguf_version(),
                             "numpy": np.__version__},
        "seed": SEED,
        "format": "per type: ggml type id, block size in bytes and weights, `bytes` the blocks "
                  "as hex, `values` the float32 values gguf.quants.dequantize gives as hex of "
                  "their little-endian bytes (bit-exact)",
        "types": {},
    }
    for name, (halves, dmins, n_blocks) in TYPES.items():
        qtype = T[name]
        elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for b in range(n_blocks):
            for off in halves:
                if b == n_blocks - 1:
                    h = random_finite_half(rng)
                    if off in dmins:
                        h = np.float16(abs(h))
                elif off in dmins:
                    h = np.float16(rng.uniform(0.0, 0.1))
                else:
                    h = np.float16(rng.uniform(-0.1, 0.1))
                raw[b, off:off + 2] = np.array([h], dtype=np.float16).view(np.uint8)
        values = quants.dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == n_blocks * elems, name
        assert np.all(np.isfinite(values)), name
        out["types"][name] = {
            "ggml_id": int(qtype),
            "block_bytes": block_bytes,
            "block_elems": elems,
            "blocks": n_blocks,
            "bytes": raw.tobytes().hex(),
            "values": values.astype("<f4").tobytes().hex(),
        }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


if __name__ == "__main__":
    main()
