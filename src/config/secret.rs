//! Values that must never reach a log: API keys, and URLs that may carry a password or a key
//! (in their userinfo or their query string).

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

/// A URL whose password and secret query values, if any, are hidden when printed.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ConnectionUrl(String);

impl ConnectionUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        ConnectionUrl(url.into())
    }

    /// The full URL, secrets included.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its password and secret query values replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

/// `url` with every secret it may carry replaced by `***`: the userinfo password, and the value
/// of each query parameter whose name marks a secret (see [`is_secret_key`]). The rest is kept so
/// that an operator can still tell which host and options are in use.
pub fn redact_url(url: &str) -> String {
    // A list of broker nodes (`amqp.url`) is comma-separated: each URL is redacted alone. A
    // comma inside a password is no separator: every node of a list names its scheme.
    let nodes: Vec<&str> = url.split(',').collect();
    if nodes.len() > 1 && nodes.iter().all(|n| n.contains("://")) {
        return nodes.into_iter().map(redact_url).collect::<Vec<_>>().join(",");
    }
    // The userinfo first: a password may hold `/`, `?`, `#` or `@` unencoded.
    let (mut out, rest) = redact_userinfo(url);
    let (head, fragment) = rest.split_once('#').map_or((rest, None), |(h, f)| (h, Some(f)));
    let (base, query) = head.split_once('?').map_or((head, None), |(b, q)| (b, Some(q)));
    out.push_str(base);
    if let Some(query) = query {
        out.push('?');
        out.push_str(&redact_query(query));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// Splits `scheme://user:password@` off `url`, the password hidden (a user alone is kept), from
/// the rest. Where the authority holds no `@`, a later `@` followed by a host still ends a
/// userinfo when a `:` comes before it: the password then holds `/`, `?` or `#`. That reading
/// may hide part of a URL whose query holds an `@`, never show a password.
fn redact_userinfo(url: &str) -> (String, &str) {
    let Some(start) = url.find("://").map(|i| i + 3) else { return (String::new(), url) };
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@').or_else(|| {
        let at = rest.rfind('@')?;
        let host = &rest[at + 1..];
        let host = &host[..host.find(['/', '?', '#']).unwrap_or(host.len())];
        let hostlike = !host.is_empty()
            && host.chars().all(|c| c.is_ascii_alphanumeric() || ".-_[]:%".contains(c));
        (hostlike && !authority.starts_with('[') && rest[..at].contains(':')).then_some(at)
    });
    let Some(at) = at else { return (url[..start].to_owned(), rest) };
    let userinfo = &rest[..at];
    let kept = match userinfo.find(':') {
        Some(colon) => format!("{}{}:***@", &url[..start], &userinfo[..colon]),
        None => format!("{}{userinfo}@", &url[..start]),
    };
    (kept, &rest[at + 1..])
}

/// `a=1&password=x;b=2` with secret values hidden; separators and other pairs are kept as sent.
fn redact_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    loop {
        let end = rest.find(['&', ';']).unwrap_or(rest.len());
        let pair = &rest[..end];
        match pair.split_once('=') {
            Some((key, _)) if is_secret_key(key) => {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(pair),
        }
        let Some(separator) = rest[end..].chars().next() else { return out };
        out.push(separator);
        rest = &rest[end + 1..];
    }
}

/// Whether a query parameter named `key` holds a secret: passwords, keys, tokens, secrets,
/// signatures and credentials under their usual spellings (`password`, `pwd`, `api_key`,
/// `apiKey`, `api-key`, `access_token`, `sslpassword`, `sig`, …), case-insensitive and after
/// percent-decoding, so `Pass%77ord` is caught too. Erring towards hiding costs only readability.
fn is_secret_key(key: &str) -> bool {
    let name: String = percent_decode(key, true)
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    matches!(name.as_str(), "pass" | "pwd" | "sig" | "auth" | "authorization")
        || ["password", "passwd", "secret", "token", "credential", "signature"]
            .iter()
            .any(|word| name.contains(word))
        || name.ends_with("key")
}

/// `%XX` escapes decoded (invalid ones kept); `+` is a space in query strings (`plus_is_space`),
/// itself elsewhere (a URL's user).
pub fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        let nodes = ConnectionUrl::new("amqp://a:hunter2@n1:5672/%2f,amqp://a:hunter3@n2:5672/%2f");
        assert_eq!(nodes.to_string(), "amqp://a:***@n1:5672/%2f,amqp://a:***@n2:5672/%2f");
        assert!(!format!("{u:?}").contains("hunter2"));
        let plain = ConnectionUrl::new("postgres://postgres@127.0.0.1/aptix");
        assert_eq!(plain.to_string(), "postgres://postgres@127.0.0.1/aptix");
        let at_in_path = ConnectionUrl::new("http://host/a@b");
        assert_eq!(at_in_path.to_string(), "http://host/a@b");
        assert_eq!(redact_url("http://host?to=a@b"), "http://host?to=a@b");
    }

    #[test]
    fn passwords_with_url_delimiters_are_redacted() {
        for password in ["pa/ss", "pa#ss", "pa?ss", "p@ss", "a/b?c#d@e", "12/34", "p,w"] {
            let url = format!("amqp://user:{password}@rabbit:5672/%2f");
            let text = redact_url(&url);
            assert_eq!(text, "amqp://user:***@rabbit:5672/%2f", "{url}");
            let pg = redact_url(&format!("postgres://u:{password}@db/aptix?sslmode=require"));
            assert_eq!(pg, "postgres://u:***@db/aptix?sslmode=require");
        }
        assert_eq!(redact_url("http://[::1]:8080/x"), "http://[::1]:8080/x");
        assert_eq!(redact_url("http://host:8080/x"), "http://host:8080/x");
    }

    #[test]
    fn secret_query_values_are_redacted() {
        let u = ConnectionUrl::new("postgres://u:pw@db/aptix?password=x&sslmode=require");
        assert_eq!(u.to_string(), "postgres://u:***@db/aptix?password=***&sslmode=require");
        let keys =
            "https://h/v1?api-version=2024&api-key=k1&ApiKey=k2&access_token=k3;SSLPassword=k4";
        assert_eq!(
            redact_url(keys),
            "https://h/v1?api-version=2024&api-key=***&ApiKey=***&access_token=***;SSLPassword=***"
        );
        for key in ["pass", "PWD", "key", "token", "secret", "apikey", "Pass%77ord", "sig"] {
            let text = redact_url(&format!("amqp://h/%2f?heartbeat=10&{key}=hunter2#frag"));
            assert_eq!(text, format!("amqp://h/%2f?heartbeat=10&{key}=***#frag"));
        }
        for kept in ["sslmode=require", "api-version=1", "heartbeat=10", "flag", "=x", ""] {
            assert_eq!(redact_url(&format!("http://h/?{kept}")), format!("http://h/?{kept}"));
        }
    }
}
