//! Shared helpers of the fuzz targets.

use std::sync::OnceLock;

/// A current-thread Tokio runtime for the targets that call async code (the body reader).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

pub mod sidecar;

use slotlight_engine::model::loader::Model;
use slotlight_engine::prompt::PromptBuilder;

/// The model of the `prompt` target: `$SLOTLIGHT_MODEL` when set, else the engine's tiny
/// synthetic test model (written to a temp file, loaded, and the file removed).
pub fn prompt_model() -> &'static (Model, PromptBuilder) {
    static M: OnceLock<(Model, PromptBuilder)> = OnceLock::new();
    M.get_or_init(|| {
        let model = match std::env::var_os("SLOTLIGHT_MODEL") {
            Some(p) => Model::load(std::path::Path::new(&p)).expect("load $SLOTLIGHT_MODEL"),
            None => {
                let path = slotlight_engine::model::testing::TinyLlama::default().write_temp();
                let m = Model::load(&path).expect("load the tiny model");
                if let Some(dir) = path.parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
                m
            }
        };
        let prompts = PromptBuilder::new(&model);
        (model, prompts)
    })
}

/// A scratch file that leaves nothing behind: created in `/dev/shm` (or the temp folder),
/// unlinked at once, and reached through `/proc/self/fd/N`. Each call replaces its contents.
pub fn scratch_file(data: &[u8]) -> &'static std::path::Path {
    use std::io::{Seek, Write};
    static F: OnceLock<(std::fs::File, std::path::PathBuf)> = OnceLock::new();
    let (file, path) = F.get_or_init(|| {
        use std::os::fd::AsRawFd;
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let real = base.join(format!("slotlight-fuzz-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&real)
            .expect("create the scratch file");
        let _ = std::fs::remove_file(&real);
        let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        (file, path)
    });
    let mut f = file;
    f.set_len(0).expect("truncate the scratch file");
    f.rewind().expect("rewind the scratch file");
    f.write_all(data).expect("write the scratch file");
    path
}
