//! `aptix bench ...`: the benchmarks under the main binary's name. They live in the `aptix-bench`
//! binary (the `bench/` crate, which builds on this library); this forwards its arguments to the
//! `aptix-bench` beside the running executable. Nothing is built here: `cargo aptix-bench ...`
//! (the alias in `.cargo/config.toml`) builds and runs the benchmarks from a checkout.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context as _};

/// Runs `aptix-bench` with `args` (after `--config PATH` when one was given to `aptix`).
pub fn run(args: Vec<OsString>, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("where this executable is")?;
    let dir = exe.parent().context("the executable's directory")?;
    let bench = dir.join(format!("aptix-bench{}", std::env::consts::EXE_SUFFIX));
    if !bench.is_file() {
        bail!(
            "`aptix bench` runs the aptix-bench binary, which is not in {}: from a checkout run \
             `cargo aptix-bench ...` instead (it builds it), or build it with \
             `cargo build --release -p aptix-bench` (docs/benchmarks.md)",
            dir.display()
        );
    }
    let mut command = Command::new(&bench);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command.args(args);
    let status = command.status().with_context(|| format!("running {}", bench.display()))?;
    // A benchmark killed by a signal has no code; 2 is this binary's "could not run".
    Ok(ExitCode::from(status.code().map_or(2, |c| u8::try_from(c).unwrap_or(2))))
}
