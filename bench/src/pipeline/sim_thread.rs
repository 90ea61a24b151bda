//! The Responses simulator on a thread of its own, so its CPU time is told apart from the
//! pipeline's.

use anyhow::Context as _;

use aptix::sim::SimConfig;

/// The simulator on a thread of its own with a single-threaded runtime: every request it serves
/// is handled there, so that thread's CPU time is the simulator's.
pub struct SimThread {
    /// Where the simulator listens.
    pub base_url: String,
    /// Its thread's id in /proc (Linux), for CPU accounting.
    pub tid: Option<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

type Ready = Result<(String, Option<String>), String>;

impl SimThread {
    pub async fn start(config: SimConfig) -> anyhow::Result<SimThread> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Ready>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread =
            std::thread::Builder::new().name("aptix-bench-sim".into()).spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    match aptix::sim::start(config).await {
                        Ok(sim) => {
                            // "/proc/thread-self" links to "<pid>/task/<tid>".
                            let tid = std::fs::read_link("/proc/thread-self").ok().and_then(|p| {
                                p.file_name().map(|n| n.to_string_lossy().into_owned())
                            });
                            let _ = ready_tx.send(Ok((sim.base_url(), tid)));
                            let _ = stop_rx.await;
                            sim.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })?;
        let (base_url, tid) =
            ready_rx.await.context("the simulator thread ended")?.map_err(anyhow::Error::msg)?;
        Ok(SimThread { base_url, tid, stop: Some(stop_tx), thread: Some(thread) })
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}
