//! Values that must never reach a log: API keys, and URLs that may carry a password.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A secret string. `Debug` and `Display` print `***`; use [`Secret::expose`] where the value is
/// actually needed (an HTTP header, a connection).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

/// A connection URL whose password, if any, is hidden when printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ConnectionUrl(String);

impl ConnectionUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        ConnectionUrl(url.into())
    }

    /// The full URL, password included.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted(&self) -> String {
        let Some(scheme_end) = self.0.find("://") else { return self.0.clone() };
        let rest = &self.0[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let Some(at) = rest[..authority_end].rfind('@') else { return self.0.clone() };
        let userinfo = &rest[..at];
        match userinfo.find(':') {
            Some(colon) => format!("{}{}:***{}", &self.0[..scheme_end + 3], &userinfo[..colon], &rest[at..]),
            None => self.0.clone(),
        }
    }
}

impl fmt::Debug for ConnectionUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for ConnectionUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for ConnectionUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("sk-live-123");
        assert_eq!(format!("{s:?} {s}"), "Secret(***) ***");
        assert_eq!(serde_json::to_string(&s).unwrap_or_default(), "\"***\"");
        assert_eq!(s.expose(), "sk-live-123");
    }

    #[test]
    fn url_passwords_are_redacted() {
        let u = ConnectionUrl::new("amqp://guest:hunter2@127.0.0.1:5672/%2f");
        assert_eq!(u.to_string(), "amqp://guest:***@127.0.0.1:5672/%2f");
        assert!(!format!("{u:?}").contains("hunter2"));
        let plain = ConnectionUrl::new("postgres://postgres@127.0.0.1/aptix");
        assert_eq!(plain.to_string(), "postgres://postgres@127.0.0.1/aptix");
        let at_in_path = ConnectionUrl::new("http://host/a@b");
        assert_eq!(at_in_path.to_string(), "http://host/a@b");
    }
}
