//! GGUF files: truncated and corrupt headers, absurd counts and sizes, hostile metadata. The
//! bytes are written to a file and read back through `GgufFile::open` (the reader maps files,
//! so that is its one entry point); a file that parses is then loaded as a model with
//! `Model::load` (configuration from metadata, weight assembly, the tokenizer built from
//! `tokenizer.ggml.*`, the chat template compiled), as `serve --model` would.
//!
//! Checked: nothing panics and nothing allocates past the rss limit (`-rss_limit_mb`):
//! every count in the header is bounded by the file's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotlight_engine::model::gguf::GgufFile;
use slotlight_engine::model::loader::Model;

fuzz_target!(|data: &[u8]| {
    let path = slotlight_fuzz::scratch_file(data);
    let Ok(g) = GgufFile::open(path) else { return };
    for (name, info) in g.tensor_infos() {
        assert!(
            info.offset
                .checked_add(info.len)
                .is_some_and(|e| e <= data.len())
        );
        if let Some(t) = g.tensor(name)
            && t.elems() > 0
            && t.elems() <= 1 << 16
        {
            let _ = t.row_f32(0);
        }
    }
    drop(g);
    let _ = Model::load(path);
});
