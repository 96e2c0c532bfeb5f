use std::process::ExitCode;

/// Runs before Rust's runtime opens /dev/null on closed standard fds: which were closed is noted for the
/// command (see `gpudoc::stdfds`).
#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_CLOSED_STD_FDS: extern "C" fn() = gpudoc::stdfds::record_at_start;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match gpudoc::commands::main(args, gpudoc::settings::Env::read()) {
        Ok(code) => code,
        Err(f) => {
            if !f.message.is_empty() {
                gpudoc::sayln!("gpudoc: {f}");
            }
            ExitCode::from(f.code)
        }
    }
}
