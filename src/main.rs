//! The `aptix` binary: parse the command line and hand over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = aptix::cli::Cli::parse();
    let failed = cli.failure_code();
    match aptix::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(failed)
        }
    }
}
