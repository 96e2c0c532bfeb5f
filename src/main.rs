use std::process::ExitCode;

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
