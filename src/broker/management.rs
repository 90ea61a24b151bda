//! RabbitMQ's management HTTP API, read-only, for what AMQP cannot tell an operator: message
//! rates per queue and which connections consume it. Each stage worker names its consuming
//! connection by stage, host and process ([`worker_name`]), so the consumers of a queue are the
//! workers serving it. Optional: without `amqp.management_url`, status shows depths and
//! consumer counts only.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{percent_decode, AmqpSettings, Secret};

/// What the management API says of one queue's traffic.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Activity {
    /// Messages published to the queue per second (RabbitMQ's last sampling interval).
    pub publish_per_s: f64,
    /// Messages its consumers acknowledged per second.
    pub ack_per_s: f64,
    /// Messages delivered and not yet acknowledged.
    pub unacked: u64,
    /// The names its consumers' connections gave themselves: the workers, one per consumer.
    pub workers: Vec<String>,
}

/// A read-only client of the management API of one vhost.
#[derive(Debug, Clone)]
pub struct Management {
    http: reqwest::Client,
    base: reqwest::Url,
    user: String,
    password: Option<Secret>,
    vhost: String,
}

/// The name a stage's consuming connection carries: stage, host and process.
pub fn worker_name(stage: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("aptix {stage} worker on {host} pid {}", std::process::id())
}

impl Management {
    /// A client of the API at `url` (`http://user:password@host:15672`) for the vhost of
    /// `amqp_url` (the first node's, for a cluster).
    pub fn new(url: &str, amqp_url: &str) -> Result<Management, ManagementError> {
        let mut base =
            reqwest::Url::parse(url).map_err(|e| ManagementError::Url("amqp.management_url", e))?;
        // The user part of a URL: `+` is itself, not a space.
        let user = percent_decode(base.username(), false);
        let password = base.password().map(|p| Secret::new(percent_decode(p, false)));
        let _ = base.set_username("");
        let _ = base.set_password(None);
        // `join` replaces a last path segment without a slash (a proxy's `/rabbitmq`).
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let first = amqp_url.split(',').next().unwrap_or_default().trim();
        let amqp = reqwest::Url::parse(first).map_err(|e| ManagementError::Url("amqp.url", e))?;
        let vhost = match amqp.path().trim_start_matches('/') {
            "" => "%2F".to_owned(),
            v => v.to_owned(),
        };
        // A management API that hangs must not hang `aptix status` or a console page.
        let http = crate::http::client()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(ManagementError::Client)?;
        Ok(Management { http, base, user, password, vhost })
    }

    /// The client `amqp` configures: none when `amqp.management_url` is empty.
    pub fn configured(amqp: &AmqpSettings) -> Result<Option<Management>, ManagementError> {
        match amqp.management_url.expose() {
            "" => Ok(None),
            url => Management::new(url, amqp.url.expose()).map(Some),
        }
    }

    /// The traffic and consumers of `queue`; `None` when the queue does not exist. Workers are
    /// named by the broker's connection names here; [`Management::connection_name`] tells
    /// what each connection called itself.
    pub async fn activity(&self, queue: &str) -> Result<Option<Activity>, ManagementError> {
        let path = format!("api/queues/{}/{}", self.vhost, encode(queue));
        let Some(q) = self.get::<QueueJson>(&path).await? else { return Ok(None) };
        let stats = q.message_stats.unwrap_or_default();
        let rate = |d: Option<Rate>| d.map_or(0.0, |d| d.rate);
        Ok(Some(Activity {
            publish_per_s: rate(stats.publish_details),
            ack_per_s: rate(stats.ack_details),
            unacked: q.messages_unacknowledged.unwrap_or_default(),
            workers: q
                .consumer_details
                .into_iter()
                .map(|c| c.channel_details.connection_name.unwrap_or_default())
                .collect(),
        }))
    }
}

impl Management {
    /// The name the connection `internal` (as the broker names it, `peer -> node`) gave
    /// itself, or `internal` when it gave none.
    pub async fn connection_name(&self, internal: &str) -> Result<String, ManagementError> {
        let path = format!("api/connections/{}", encode(internal));
        let Some(c) = self.get::<ConnectionJson>(&path).await? else {
            return Ok(internal.to_owned()); // closed meanwhile
        };
        let own = c.user_provided_name.or(c.client_properties.and_then(|p| p.connection_name));
        Ok(own.unwrap_or_else(|| internal.to_owned()))
    }

    /// GETs `path` under the API; `None` on 404.
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Option<T>, ManagementError> {
        let url = self.base.join(path).map_err(|e| ManagementError::Url("a management path", e))?;
        let response = self
            .http
            .get(url)
            .basic_auth(&self.user, self.password.as_ref().map(Secret::expose))
            .send()
            .await
            .map_err(|e| ManagementError::Client(e.without_url()))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(ManagementError::Status { status, path: path.to_owned() });
        }
        response.json().await.map(Some).map_err(ManagementError::Client)
    }
}

/// Why the management API could not be asked, or what it answered instead.
#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    /// A configured URL does not parse.
    #[error("{0}: {1}")]
    Url(&'static str, url::ParseError),
    /// The HTTP client failed (connection, timeout, a body that is not the expected JSON).
    #[error("management API: {0}")]
    Client(reqwest::Error),
    /// It did not answer in time.
    #[error("no answer within {} s", .0.as_secs())]
    Timeout(Duration),
    /// It answered with an error status.
    #[error("management API answered {status} for /{path}")]
    Status {
        /// The status.
        status: reqwest::StatusCode,
        /// The path asked.
        path: String,
    },
}

/// A queue name as one path segment (`%2F` for `/`, and so on).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[derive(Debug, Deserialize)]
struct QueueJson {
    messages_unacknowledged: Option<u64>,
    message_stats: Option<Stats>,
    #[serde(default)]
    consumer_details: Vec<ConsumerJson>,
}

#[derive(Debug, Default, Deserialize)]
struct Stats {
    publish_details: Option<Rate>,
    ack_details: Option<Rate>,
}

#[derive(Debug, Deserialize)]
struct Rate {
    rate: f64,
}

#[derive(Debug, Deserialize)]
struct ConsumerJson {
    channel_details: ChannelJson,
}

#[derive(Debug, Deserialize)]
struct ChannelJson {
    connection_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ConnectionJson {
    user_provided_name: Option<String>,
    client_properties: Option<ClientProperties>,
}

#[derive(Debug, Deserialize)]
struct ClientProperties {
    connection_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_the_url_and_the_vhost_comes_from_amqp() {
        let m = Management::new("http://ops:p%40ss@rabbit:15672/", "amqp://u:p@n1/%2f,amqp://n2/x")
            .unwrap();
        assert_eq!(
            (m.user.as_str(), m.password.as_ref().map(Secret::expose)),
            ("ops", Some("p@ss"))
        );
        assert_eq!(m.base.as_str(), "http://rabbit:15672/");
        assert!(!format!("{m:?}").contains("p@ss"), "the password stays out of Debug");
        assert_eq!(m.vhost, "%2f");
        let m = Management::new("http://proxy/rabbitmq", "amqp://n1").unwrap();
        assert_eq!(m.base.join("api/queues").unwrap().as_str(), "http://proxy/rabbitmq/api/queues");
        let m = Management::new("http://rabbit:15672/", "amqp://n1:5672").unwrap();
        assert_eq!(m.vhost, "%2F");
        assert_eq!(encode("aptix.requests.p16.03"), "aptix.requests.p16.03");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
        assert!(worker_name("invoke").starts_with("aptix invoke worker on "));
    }
}
