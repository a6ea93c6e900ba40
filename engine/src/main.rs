//! The `slotlight-engine` binary.

fn main() -> std::process::ExitCode {
    slotlight_engine::cli::main()
}
