//! `aptix bench ...`: the benchmarks under the main binary's name. They live in the `aptix-bench`
//! binary (the `bench/` crate, which builds on this library), so this forwards its arguments to
//! the `aptix-bench` beside the running executable. Under `cargo run` it first builds that binary
//! with the same profile into the same target directory, so the benchmark measures the sources
//! that `cargo run` just built, not an older `aptix-bench`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context as _};

/// Runs `aptix-bench` with `args` (after `--config PATH` when one was given to `aptix`).
pub fn run(args: Vec<OsString>, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("where this executable is")?;
    let dir = exe.parent().context("the executable's directory")?;
    let bench = dir.join(format!("aptix-bench{}", std::env::consts::EXE_SUFFIX));
    // `cargo run` sets both for the program it runs; the bench crate beside the manifest says
    // this is the workspace that built us.
    let cargo = std::env::var_os("CARGO").zip(std::env::var_os("CARGO_MANIFEST_DIR"));
    if let Some((cargo, workspace)) = cargo {
        if Path::new(&workspace).join("bench/Cargo.toml").is_file() {
            build_with_cargo(&cargo, Path::new(&workspace), dir)?;
        }
    }
    if !bench.is_file() {
        bail!(
            "`aptix bench` runs the aptix-bench binary, which is not built in {}: build it with \
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

/// Builds `aptix-bench` as `cargo run` built this binary: its profile is the name of the
/// directory the executable is in (`debug` is the `dev` profile), its target directory that
/// directory's parent.
fn build_with_cargo(cargo: &OsString, workspace: &Path, dir: &Path) -> anyhow::Result<()> {
    let (profile, target_dir) = cargo_profile(dir)
        .with_context(|| format!("{} is not a cargo profile directory", dir.display()))?;
    eprintln!("aptix bench: building aptix-bench (profile {profile})");
    let mut command = Command::new(cargo);
    // What `cargo run` set for this program describes aptix, not the build: build scripts that
    // watch such a variable would see it change and rebuild half the dependency tree.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(&name);
        }
    }
    let status = command
        .current_dir(workspace)
        .args(["build", "--quiet", "-p", "aptix-bench", "--bin", "aptix-bench", "--profile"])
        .arg(&profile)
        .arg("--target-dir")
        .arg(&target_dir)
        .status()
        .context("running cargo build -p aptix-bench")?;
    if !status.success() {
        bail!("cargo build -p aptix-bench failed ({status})");
    }
    Ok(())
}

/// Whether cargo sets `name` for the program `cargo run` runs (its "environment variables Cargo
/// sets for crates"; `CARGO` itself is kept).
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

/// The cargo profile and target directory of a profile output directory such as
/// `target/release` or `target/debug`.
fn cargo_profile(dir: &Path) -> Option<(String, PathBuf)> {
    let name = dir.file_name()?.to_str()?;
    let profile = if name == "debug" { "dev" } else { name };
    Some((profile.to_owned(), dir.parent()?.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_comes_from_the_output_directory() {
        let (profile, target) = cargo_profile(Path::new("/w/target/release")).unwrap();
        assert_eq!((profile.as_str(), target.as_path()), ("release", Path::new("/w/target")));
        let (profile, target) = cargo_profile(Path::new("/c/t/debug")).unwrap();
        assert_eq!((profile.as_str(), target.as_path()), ("dev", Path::new("/c/t")));
        assert!(cargo_profile(Path::new("/")).is_none());
    }

    #[test]
    fn what_cargo_run_set_is_not_passed_to_the_build() {
        for name in ["CARGO_PKG_NAME", "CARGO_PKG_VERSION_MAJOR", "CARGO_MANIFEST_DIR", "OUT_DIR"] {
            assert!(set_by_cargo_run(name), "{name}");
        }
        for name in ["CARGO", "CARGO_HOME", "CARGO_TARGET_DIR", "CARGO_PROFILE_RELEASE_DEBUG"] {
            assert!(!set_by_cargo_run(name), "{name}");
        }
    }
}
