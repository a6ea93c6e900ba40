//! The block decoder against GGML's own definition: random blocks of every quantized type of
//! llama.cpp's presets, decoded by gguf-py (`tests/reference/make_quant_fixtures.py`), must
//! decode to the same bits here.

mod support;

use serde_json::Value;
use slotlight_engine::model::weights::{DType, dequantize};

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn every_block_type_decodes_as_gguf_py_does() {
    let text = std::fs::read_to_string(support::fixtures().join("quant_blocks.json"))
        .expect("quant_blocks.json");
    let fixture: Value = serde_json::from_str(&text).expect("json");
    let types = fixture["types"].as_object().expect("types");
    let mut checked = Vec::new();
    for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
        let case = &types
            .get(dtype.name())
            .unwrap_or_else(|| panic!("no fixture for {}", dtype.name()));
        assert_eq!(case["ggml_id"].as_u64(), Some(u64::from(dtype.ggml_id())));
        let as_usize = |k: &str| usize::try_from(case[k].as_u64().expect(k)).expect(k);
        assert_eq!(
            as_usize("block_bytes"),
            dtype.block_bytes(),
            "{}",
            dtype.name()
        );
        assert_eq!(
            as_usize("block_elems"),
            dtype.block_elems(),
            "{}",
            dtype.name()
        );
        let bytes = hex(case["bytes"].as_str().expect("bytes"));
        let want: Vec<f32> = hex(case["values"].as_str().expect("values"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let blocks = as_usize("blocks");
        assert_eq!(bytes.len(), blocks * dtype.block_bytes());
        assert_eq!(want.len(), blocks * dtype.block_elems());
        assert!(want.iter().filter(|v| **v != 0.0).count() > want.len() / 2);
        let mut got = vec![f32::NAN; want.len()];
        dequantize(dtype, &bytes, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits(),
                "{}: weight {i} (block {}, index {}): engine {g:e}, gguf-py {w:e}",
                dtype.name(),
                i / dtype.block_elems(),
                i % dtype.block_elems()
            );
        }
        checked.push(dtype.name());
    }
    assert_eq!(
        checked.len(),
        12,
        "every block type was checked: {checked:?}"
    );
}
