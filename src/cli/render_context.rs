//! `aptix render-context FILE|-`: prints the AGN-002 `[CONTEXT]` block for a JSON array of
//! chunks (`[{"id","path","start_line","end_line","language","text"}]`), exactly as assembly
//! puts it into a request. An empty array prints nothing.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use crate::assemble::render_context_block;
use crate::chunk::Chunk;

/// Renders the block for the chunks in `path`; exit 0 on success, 1 when the input is not a
/// JSON array of chunks, 2 when it cannot be read or the output cannot be written.
pub fn run(path: &Path) -> ExitCode {
    let bytes = match super::read_input(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let chunks: Vec<Chunk> = match serde_json::from_slice(&bytes) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "error: {} is not a JSON array of chunks \
                 ({{\"id\",\"path\",\"start_line\",\"end_line\",\"language\",\"text\"}}): {e}",
                path.display()
            );
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(render_context_block(&chunks).as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the block: {e}");
            ExitCode::from(2)
        }
    }
}
