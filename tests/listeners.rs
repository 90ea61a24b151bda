//! The processes' HTTP listeners (metrics and files, the console) face clients: one that sends
//! its request head too slowly is cut off, and connections past the limit are closed at once,
//! so no client holds a worker's memory by keeping requests half sent.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use axum::routing::get;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Reads until the server closes the connection; how long that took.
async fn closed_after(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0_u8; 1024];
    loop {
        match tokio::time::timeout_at((started + limit).into(), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("still open after {limit:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_request_head_is_cut_off_and_connections_past_the_limit_are_closed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let app = axum::Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(aptix::http::serve(listener, app, shutdown.clone()));

    // A head never finished: cut off after the head timeout (10 s), not held.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nX: ").await.unwrap();
    slow.write_all(&vec![b'a'; 64 * 1024]).await.unwrap();
    let took = closed_after(&mut slow, Duration::from_secs(30)).await;
    assert!(took >= Duration::from_secs(5), "cut off after {took:?}");

    // 256 connections held open: the next is closed at once, and served again once they go.
    let mut held = Vec::new();
    for _ in 0..256 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nX: ").await.unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut over = TcpStream::connect(addr).await.unwrap();
    let took = closed_after(&mut over, Duration::from_secs(3)).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = aptix::http::client().build().unwrap();
    let ok = client.get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(ok.text().await.unwrap(), "ok");
    shutdown.cancel();
}
