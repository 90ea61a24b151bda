//! The `aptix` binary: parse the command line and hand over to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match aptix::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            let args: Vec<_> = std::env::args_os().collect();
            return ExitCode::from(aptix::cli::usage_code(&e, &args));
        }
    };
    let failed = cli.failure_code();
    match aptix::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(failed)
        }
    }
}
