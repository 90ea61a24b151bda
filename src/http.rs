//! The HTTP clients of every process (the LLM, embeddings, the broker's management API, trace
//! export, MCP servers, and the tests'): reqwest on rustls with the `ring` crypto provider the
//! rest of the dependency tree uses, installed once before the first client is built. Clients
//! are built only through here (clippy.toml forbids `reqwest::Client::new` and its kin):
//! reqwest 0.13 without a provider of its own panics on a client built before one is installed.
//! And the one way the processes' listeners serve (`serve`): bounded in connections and time.

use std::sync::{Arc, Once};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;

/// Connections a listener serves at once; one more is closed as soon as it is accepted.
const MAX_CONNECTIONS: usize = 256;
/// How long a client may take to send a request's head (a slow one holds a connection and up
/// to hyper's ~400 KB header buffer); an idle kept-alive connection is closed after it too.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// After this long a connection takes no new request.
const CONNECTION_LIFE: Duration = Duration::from_secs(120);
/// How long a request in flight may still take once its connection stops taking new ones (a
/// long time, a replay or a download, ends cut off after it).
const GRACE: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown`: at most [`MAX_CONNECTIONS`] at once, each
/// sending its request head within [`HEAD_TIMEOUT`] and taking requests for
/// [`CONNECTION_LIFE`]. Listeners face clients (files) and whoever reaches the metrics port:
/// axum's own serve bounds neither, and one client holding thousands of half-sent requests
/// could fill the memory of a process that also runs pipeline stages. On `shutdown`, requests
/// in flight finish (within [`GRACE`]) before this returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        // A failed accept (a connection reset before it was taken, no file descriptor left)
        // ends no listener: the next one is taken after a moment.
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let service = TowerToHyperService::new(app.clone());
        connections.spawn(connection(stream, service, shutdown.clone(), slot));
    }
    connections.close();
    let _ = tokio::time::timeout(GRACE, connections.wait()).await;
    Ok(())
}

/// Serves one connection until it ends, its life is over or `stop`; then it takes no new
/// request, and the one in flight gets [`GRACE`] to finish.
async fn connection(
    stream: tokio::net::TcpStream,
    service: TowerToHyperService<axum::Router>,
    stop: CancellationToken,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEAD_TIMEOUT);
    let connection = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = tokio::time::sleep(CONNECTION_LIFE) => {}
        _ = stop.cancelled() => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(GRACE, connection).await;
}

/// A builder of an async client, the TLS provider installed, following no redirect: a server
/// (a provider, a tenant's `llm_base_url`, a tool server) that answers with one could otherwise
/// send the pipeline's request, with the headers configured for that server, to any address
/// the worker reaches (an internal service, the cloud's metadata address). A redirect is an
/// answer like any other status.
pub fn client() -> reqwest::ClientBuilder {
    install_provider();
    #[allow(clippy::disallowed_methods)]
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// A builder of a blocking client (for code outside any runtime), the TLS provider installed,
/// following no redirect (see [`client`]).
pub fn blocking() -> reqwest::blocking::ClientBuilder {
    install_provider();
    #[allow(clippy::disallowed_methods)]
    reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none())
}

fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err: a provider is installed already (the embedding program's choice), which is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `GET url` with a client of its own (a one-off request).
pub async fn get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    client().build()?.get(url).send().await
}
