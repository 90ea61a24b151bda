//! The HTTP clients of every process (the LLM, embeddings, the broker's management API, trace
//! export, MCP servers, and the tests'): reqwest on rustls with the `ring` crypto provider the
//! rest of the dependency tree uses, installed once before the first client is built. Clients
//! are built only through here (clippy.toml forbids `reqwest::Client::new` and its kin):
//! reqwest 0.13 without a provider of its own panics on a client built before one is installed.

use std::sync::Once;

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
