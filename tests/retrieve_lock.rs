//! The embedded vector store belongs to one process: a second retrieve worker on the same
//! directory stops at start with a message naming the fix, instead of failing every turn later.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_retrieve_process_on_the_embedded_store_stops_at_start() {
    // This process holds the store: the harness indexed the fixture into it.
    let h = Harness::start(0).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["worker", "retrieve"])
        .env_remove("APTIX_CONFIG")
        .envs(h.child_env())
        .env("APTIX__VECTOR__DATA_DIR", h.settings.vector.data_dir.display().to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the second retrieve worker kept running on a locked store");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{status:?}: {stderr}");
    assert!(stderr.contains("the retrieve stage cannot start"), "{stderr}");
    assert!(stderr.contains("in use by another process"), "{stderr}");
    assert!(stderr.contains("vector.url"), "names the fix: {stderr}");
    h.teardown().await;
}
