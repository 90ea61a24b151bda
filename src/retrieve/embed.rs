//! Optional dense embeddings from an OpenAI-compatible `POST {base}/embeddings` endpoint.

use std::time::Duration;

use serde::Deserialize;
use tracing::warn;

use super::RetrieveError;
use crate::config::{ConnectionUrl, Settings};

/// Texts per embeddings request.
pub const EMBED_BATCH: usize = 64;

/// A client for one embeddings endpoint and model.
#[derive(Debug, Clone)]
pub struct Embedder {
    http: reqwest::Client,
    url: String,
    api_key: Option<String>,
    model: String,
    dimension: usize,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

/// Most bytes of an error answer read (the status alone classifies it).
const ERROR_BODY_BYTES: usize = 64 << 10;

/// `response`'s body, or `None` once it passes `most` bytes: the endpoint's answer is read
/// whole before it is parsed, and a runaway one must not fill the worker.
async fn read_at_most(
    mut response: reqwest::Response,
    most: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > most {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

impl Embedder {
    /// The configured embedder, or `None` when `vector.embeddings_url` is unset.
    pub fn from_settings(settings: &Settings) -> Result<Option<Self>, RetrieveError> {
        let v = &settings.vector;
        let Some(base) =
            v.embeddings_url.as_ref().map(ConnectionUrl::expose).filter(|u| !u.trim().is_empty())
        else {
            return Ok(None);
        };
        if v.embeddings_dimension == 0 {
            return Err(RetrieveError::Config(
                "vector.embeddings_dimension must be at least 1".into(),
            ));
        }
        let api_key = v
            .embeddings_api_key
            .as_ref()
            .or(settings.llm.api_key.as_ref())
            .map(|k| k.expose().to_owned());
        let http = crate::http::client()
            .timeout(Duration::from_secs(v.timeout_secs.max(1) * 3))
            .connect_timeout(Duration::from_secs(v.connect_timeout_secs.max(1)))
            .build()
            .map_err(|e| RetrieveError::Config(format!("embeddings client: {e}")))?;
        Ok(Some(Embedder {
            http,
            url: format!("{}/embeddings", base.trim_end_matches('/')),
            api_key,
            model: v.embeddings_model.clone(),
            dimension: v.embeddings_dimension,
        }))
    }

    /// Dimension of the vectors this embedder returns.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// One vector per text, in order.
    pub async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, RetrieveError> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(EMBED_BATCH) {
            out.extend(self.embed_batch(batch).await?);
        }
        Ok(out)
    }

    async fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, RetrieveError> {
        let body = serde_json::json!({ "model": self.model, "input": texts, "dimensions": self.dimension });
        let mut request = self.http.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let fail =
            |message: String, retryable: bool| RetrieveError::Embedding { message, retryable };
        // Error texts may reach a client once retries run out: no URL (it may carry a key) and
        // no provider text (it may name the account); the provider's words go to the log.
        let response = request.send().await.map_err(|e| fail(e.without_url().to_string(), true))?;
        let status = response.status();
        if !status.is_success() {
            let retryable = status.as_u16() == 429 || status.is_server_error();
            let text = read_at_most(response, ERROR_BODY_BYTES).await.ok().flatten();
            let error = crate::llm::ProviderError::from_body(&text.unwrap_or_default());
            let code = error.code.as_deref().or(error.kind.as_deref()).unwrap_or("no code");
            warn!(status = status.as_u16(), provider_error = %error, "embeddings endpoint refused the request");
            return Err(fail(format!("HTTP {} ({code})", status.as_u16()), retryable));
        }
        // The vectors asked for, as JSON (pretty-printed floats take some 30 bytes each), with
        // room to spare: anything larger is not an answer.
        let most = texts.len().saturating_mul(self.dimension).saturating_mul(64) + (1 << 20);
        let body = read_at_most(response, most)
            .await
            .map_err(|e| fail(e.without_url().to_string(), true))?
            .ok_or_else(|| fail(format!("the answer is larger than {most} bytes"), false))?;
        let parsed: EmbeddingsResponse =
            serde_json::from_slice(&body).map_err(|e| fail(e.to_string(), false))?;
        let mut vectors = vec![Vec::new(); texts.len()];
        for item in parsed.data {
            if item.embedding.len() != self.dimension {
                return Err(fail(
                    format!(
                        "embedding has dimension {}, expected {}",
                        item.embedding.len(),
                        self.dimension
                    ),
                    false,
                ));
            }
            if let Some(slot) = vectors.get_mut(item.index) {
                *slot = item.embedding;
            }
        }
        if vectors.iter().any(Vec::is_empty) {
            return Err(fail(
                format!("the endpoint returned fewer than {} embeddings", texts.len()),
                false,
            ));
        }
        Ok(vectors)
    }
}
