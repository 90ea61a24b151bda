//! Who is looking: every console page but `/healthz` needs a sign-in. HTTP Basic (the browser
//! asks) as `admin` (every page and the dead-letter actions), `viewer` (every page) or a
//! tenant's name (only that tenant's sessions and turns), with the tokens of `[console]`; or a
//! scope named by a trusted reverse proxy's header. Nothing configured: nothing is served.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use std::sync::Arc;

use crate::config::ConsoleSettings;

/// What a signed-in operator may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Everything, and replay and discard.
    Admin,
    /// Everything, no action.
    Viewer,
    /// One tenant's sessions and turns only.
    Tenant(String),
}

impl Scope {
    /// The tenant a scoped operator is limited to.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Scope::Tenant(t) => Some(t),
            _ => None,
        }
    }
}

/// The scope the request signs in with, if any.
pub fn scope_of(settings: &ConsoleSettings, headers: &HeaderMap) -> Option<Scope> {
    let trusted = settings.trusted_scope_header.trim();
    if !trusted.is_empty() {
        if let Some(value) = headers.get(trusted).and_then(|v| v.to_str().ok()) {
            return match value.trim() {
                "*" => Some(Scope::Viewer),
                v => v
                    .strip_prefix("tenant:")
                    .filter(|t| !t.is_empty())
                    .map(|t| Scope::Tenant(t.into())),
            };
        }
    }
    let (user, password) = basic(headers)?;
    let matches = |token: &Option<crate::config::Secret>| {
        token.as_ref().is_some_and(|t| !t.expose().is_empty() && same(t.expose(), &password))
    };
    match user.as_str() {
        "admin" if matches(&settings.admin_token) => Some(Scope::Admin),
        "viewer" if matches(&settings.viewer_token) => Some(Scope::Viewer),
        tenant => {
            let token = settings.tenant_tokens.get(tenant).cloned();
            matches(&token).then(|| Scope::Tenant(tenant.to_owned()))
        }
    }
}

/// `user:password` of an `Authorization: Basic` header.
fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ").or_else(|| value.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// Compares without an early exit (the length is not secret).
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Lets a request through with its [`Scope`] as an extension, or answers 401.
pub async fn require(
    State(settings): State<Arc<ConsoleSettings>>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    match scope_of(&settings, request.headers()) {
        Some(scope) => {
            request.extensions_mut().insert(scope);
            next.run(request).await
        }
        None => {
            let challenge =
                HeaderValue::from_static("Basic realm=\"aptix console\", charset=\"UTF-8\"");
            let text = "sign in: user `admin` or `viewer` (or a tenant's name) with its console token (docs/deploy.md, \"Console\")\n";
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], text)
                .into_response()
        }
    }
}

/// Refuses what a browser says another origin asked for (`Sec-Fetch-Site: cross-site` or
/// `same-site`), except following a link to a page: a signed-in operator's browser sends its sign-in with any
/// request, so a hostile page could otherwise make the console read a session or 200 dead
/// letters for it, again and again, unseen. Requests without the header (older browsers, `curl`)
/// pass: they are not a browser acting for another site.
pub async fn same_site(request: Request, next: Next) -> Response {
    if cross_site(request.method(), request.headers()) {
        let text = "refused: another site asked for this (Sec-Fetch-Site: cross-site or same-site); open the console's pages from the console\n";
        return (StatusCode::FORBIDDEN, text).into_response();
    }
    next.run(request).await
}

/// Whether the request comes from another origin and is not a link followed to a page. A
/// same-site origin is another origin too: a tenant's app on a sibling subdomain is as foreign
/// to the console as another site.
fn cross_site(method: &axum::http::Method, headers: &HeaderMap) -> bool {
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let navigation = method == axum::http::Method::GET
        && value("sec-fetch-mode") == "navigate"
        && matches!(value("sec-fetch-dest"), "document" | "");
    matches!(value("sec-fetch-site"), "cross-site" | "same-site") && !navigation
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn settings() -> ConsoleSettings {
        let mut s = ConsoleSettings {
            admin_token: Some(Secret::new("adm-secret")),
            viewer_token: Some(Secret::new("view-secret")),
            ..Default::default()
        };
        s.tenant_tokens.insert("acme".into(), Secret::new("acme-secret"));
        s
    }

    fn with_basic(user: &str, password: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        h.insert(
            header::AUTHORIZATION,
            format!("Basic {encoded}").parse().unwrap_or(HeaderValue::from_static("")),
        );
        h
    }

    #[test]
    fn each_token_signs_in_its_own_user_only() {
        let s = settings();
        assert_eq!(scope_of(&s, &with_basic("admin", "adm-secret")), Some(Scope::Admin));
        assert_eq!(scope_of(&s, &with_basic("viewer", "view-secret")), Some(Scope::Viewer));
        assert_eq!(
            scope_of(&s, &with_basic("acme", "acme-secret")),
            Some(Scope::Tenant("acme".into()))
        );
        assert_eq!(scope_of(&s, &with_basic("admin", "view-secret")), None);
        assert_eq!(scope_of(&s, &with_basic("other", "acme-secret")), None);
        assert_eq!(scope_of(&s, &with_basic("viewer", "")), None);
        assert_eq!(scope_of(&s, &HeaderMap::new()), None);
        assert_eq!(scope_of(&ConsoleSettings::default(), &with_basic("admin", "")), None);
    }

    #[test]
    fn only_links_from_other_sites_are_let_through() {
        let get = axum::http::Method::GET;
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        let image = headers(&[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "no-cors"),
            ("sec-fetch-dest", "image"),
        ]);
        assert!(cross_site(&get, &image));
        let link = headers(&[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ]);
        assert!(!cross_site(&get, &link));
        assert!(cross_site(&axum::http::Method::POST, &link), "a form posted from elsewhere");
        for site in ["same-origin", "none"] {
            let own = headers(&[("sec-fetch-site", site), ("sec-fetch-mode", "no-cors")]);
            assert!(!cross_site(&get, &own), "{site}");
        }
        let sibling = headers(&[("sec-fetch-site", "same-site"), ("sec-fetch-mode", "no-cors")]);
        assert!(cross_site(&get, &sibling), "a sibling subdomain's page");
        assert!(!cross_site(&get, &HeaderMap::new()), "no header: not a browser's request");
    }

    #[test]
    fn a_trusted_header_names_a_scope_only_when_configured() {
        let mut s = settings();
        let mut h = HeaderMap::new();
        h.insert("x-scope", HeaderValue::from_static("tenant:acme"));
        assert_eq!(scope_of(&s, &h), None, "not configured: the header is anyone's");
        s.trusted_scope_header = "X-Scope".into();
        assert_eq!(scope_of(&s, &h), Some(Scope::Tenant("acme".into())));
        h.insert("x-scope", HeaderValue::from_static("*"));
        assert_eq!(scope_of(&s, &h), Some(Scope::Viewer));
        h.insert("x-scope", HeaderValue::from_static("admin"));
        assert_eq!(scope_of(&s, &h), None, "a proxy never grants actions");
    }
}
