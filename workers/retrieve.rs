//! The retrieve stage as its own process: configuration from `APTIX_CONFIG` and `APTIX__*`,
//! telemetry, build, run until SIGTERM. Start more copies to scale the stage.

fn main() -> std::process::ExitCode {
    aptix::worker::main("retrieve")
}
