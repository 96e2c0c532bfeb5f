fn main() -> std::process::ExitCode {
    gpudoc::cli::main()
}
