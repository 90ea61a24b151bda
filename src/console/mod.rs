//! `aptix console`: a web console over the running system, rendered on the server. Sessions and
//! their turns from PostgreSQL, queues and dead letters from RabbitMQ, and the operator actions
//! log. Every page but `/healthz` needs a sign-in (`auth`); an operator scoped to one tenant
//! sees that tenant's sessions only. Replay and discard need the admin sign-in and take the
//! token again in the form, so a page of another site cannot act for an operator, and every
//! action is recorded. A browser's request made by another site (an image, a script's fetch) is
//! refused before anything is read (`auth::same_site`).

mod auth;
mod budgets;
mod charts;
mod evals;
mod pages;
mod turn;

pub use auth::Scope;

use std::sync::Arc;

use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::Markup;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::management::Management;
use crate::broker::{with_activity, DeadAction, Publisher, Topology};
use crate::config::{Secret, Settings};
use crate::contracts::SessionId;
use crate::store::{OperatorAction, SessionSearch, Store};

/// What every page needs.
#[derive(Debug)]
pub struct Console {
    settings: Settings,
    store: Store,
    publisher: Publisher,
    topology: Topology,
    /// Replay and discard need it; none: read-only.
    admin_token: Option<Secret>,
    /// Rates and workers per queue; none without `amqp.management_url`.
    management: Option<Management>,
}

impl Console {
    /// A console over `settings`' database and broker, with its `console` settings.
    pub async fn connect(settings: Settings) -> anyhow::Result<Self> {
        let store = Store::connect(settings.database.url.expose(), 4)?;
        let publisher = Publisher::connect_reading_clients(settings.amqp.url.expose()).await?;
        let topology = crate::pipeline::topology(&settings);
        let token = settings.console.admin_token.clone();
        let admin_token = token.filter(|t| !t.expose().is_empty());
        let management = Management::configured(&settings.amqp)?;
        Ok(Console { settings, store, publisher, topology, admin_token, management })
    }

    fn admin(&self) -> bool {
        self.admin_token.is_some()
    }

    fn token_ok(&self, given: &str) -> bool {
        self.admin_token.as_ref().is_some_and(|t| auth::same(t.expose(), given))
    }
}

/// Serves the console on `listener` until `shutdown`.
pub async fn serve(
    console: Console,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let admin = console.admin();
    let signing_in = Arc::new(console.settings.console.clone());
    let app = Router::new()
        .route("/", get(|| async { Redirect::to("/sessions") }))
        .route("/sessions", get(sessions))
        .route("/sessions/{id}", get(session))
        .route("/sessions/{id}/turns/{turn}", get(turn_page))
        .route("/queues", get(queues))
        .route("/dead/{action}", post(dead_action))
        .route("/healthz", get(|| async { "ok" }))
        .route("/actions", get(actions))
        .route("/budgets", get(budgets::page))
        .route("/evals", get(evals::list))
        .route("/evals/{run}", get(evals::page))
        .layer(axum::middleware::from_fn_with_state(signing_in, auth::require))
        .layer(axum::middleware::from_fn(auth::same_site))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(Arc::new(console));
    info!(addr = %listener.local_addr()?, admin, "serving the console");
    crate::http::serve(listener, app, shutdown).await
}

/// Pages are self-contained: no script, no outside resource, no framing.
async fn secure_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    let csp =
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'";
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // Pages show stored requests and answers: nothing of them in the browser's disk cache.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

pub(crate) type Page = Result<Markup, (StatusCode, Markup)>;

pub(crate) fn failed(e: impl std::fmt::Display) -> (StatusCode, Markup) {
    tracing::warn!(error = %e, "console page failed");
    (StatusCode::INTERNAL_SERVER_ERROR, pages::message("Something failed", &e.to_string()))
}

pub(crate) fn not_found(what: &str) -> (StatusCode, Markup) {
    (StatusCode::NOT_FOUND, pages::message("Not found", what))
}

#[derive(Debug, Default, Deserialize)]
struct SearchQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
}

/// Pages about every tenant (queues, dead letters, actions) are not a tenant operator's.
pub(crate) fn everyone(scope: &Scope) -> Result<(), (StatusCode, Markup)> {
    match scope {
        Scope::Tenant(_) => Err(not_found("this page is not shown to a tenant's operator")),
        _ => Ok(()),
    }
}

/// A session's view, bounded (`Store::console_view`) and with `turn`'s request and records,
/// if `scope` may see it (another tenant's reads as missing).
async fn visible(
    c: &Console,
    scope: &Scope,
    id: &str,
    turn: Option<&str>,
) -> Result<crate::store::SessionView, (StatusCode, Markup)> {
    let session: SessionId = id.parse().map_err(|_| not_found("no such session"))?;
    let view = c.store.console_view(&session, turn, scope.tenant()).await.map_err(failed)?;
    view.ok_or_else(|| not_found("no such session"))
}

async fn sessions(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
    Query(q): Query<SearchQuery>,
) -> Page {
    let time = |s: &str| chrono::DateTime::parse_from_rfc3339(s.trim()).ok().map(|t| t.to_utc());
    let search = SessionSearch {
        text: q.q.clone(),
        since: time(&q.since),
        until: time(&q.until),
        tenant: scope.tenant().map(str::to_owned),
        limit: 200,
    };
    let found = c.store.search_sessions(&search).await.map_err(failed)?;
    Ok(pages::sessions(&q.q, &q.since, &q.until, &found))
}

async fn session(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Page {
    Ok(pages::session(&visible(&c, &scope, &id, None).await?))
}

async fn turn_page(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
    Path((id, turn_id)): Path<(String, String)>,
) -> Page {
    let view = visible(&c, &scope, &id, Some(&turn_id)).await?;
    let found = turn::Turn::of(&view, &turn_id, &c.settings.telemetry.prices);
    Ok(turn::page(&found.ok_or_else(|| not_found("no such turn"))?))
}

#[derive(Debug, Deserialize)]
struct QueuesQuery {
    /// An `operator_actions` row, told on top of the page: where an action redirects to.
    action: Option<i64>,
}

/// The queues page, with what recorded action `?action=` did on top. The notice is read from
/// the action's record, never from the address: a link could otherwise make the console say
/// anything.
async fn queues(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
    Query(q): Query<QueuesQuery>,
) -> Page {
    everyone(&scope)?;
    let notice = match q.action {
        None => String::new(),
        Some(id) => match c.store.action(id).await.map_err(failed)? {
            Some(recorded) => notice(&recorded),
            None => format!("no recorded action {id}"),
        },
    };
    let mut states =
        c.topology.queue_states(&c.publisher, &c.settings.tenant_names()).await.map_err(failed)?;
    let rates = match &c.management {
        None => {
            Err("rates and workers need amqp.management_url (RabbitMQ's management API)".into())
        }
        Some(api) => with_activity(&mut states, api).await.map_err(|e| format!("rates: {e}")),
    };
    let dead = c
        .topology
        .dead_letters(&c.publisher, &crate::dead::queues(&c.settings), DEAD_LISTED)
        .await
        .map_err(failed)?;
    let missing = rates.err().unwrap_or_default();
    let admin = c.admin() && scope == Scope::Admin;
    Ok(pages::queues(&states, &dead, admin, &notice, &missing))
}

/// Most dead letters the queues page lists, and most bytes of them it reads: a client can make
/// letters of the broker's 16 MiB, and every load reads each whole.
const DEAD_LISTED: (usize, usize) = (200, 32 * 1024 * 1024);

/// What a recorded dead-letter action did, in a line.
fn notice(a: &OperatorAction) -> String {
    let id = &a.message_id;
    let detail = |key: &str| a.detail.get(key).and_then(|v| v.as_str()).unwrap_or("-").to_owned();
    match (a.action.as_str(), a.outcome.as_str()) {
        ("dead.replay", "done") => format!("replayed {id}"),
        (_, "done") => format!("discarded {id}"),
        (_, "not_found") => format!("no dead letter {id} (another operator may hold it)"),
        (_, "refused") => format!("not replayed: {}", detail("refused")),
        (_, "failed") => format!("{} of {id} failed: {}", a.action, detail("error")),
        _ => format!("{} of {id} has not finished", a.action),
    }
}

#[derive(Debug, Deserialize)]
struct ActionForm {
    id: String,
    /// The dead-letter queue the page listed it in: two letters can share a client's id.
    queue: Option<String>,
    token: String,
}

async fn dead_action(
    State(c): State<Arc<Console>>,
    Extension(scope): Extension<Scope>,
    Path(action): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    let id = form.id;
    let action = match action.as_str() {
        "replay" => DeadAction::Replay,
        "discard" => DeadAction::Discard,
        _ => return not_found("no such action").into_response(),
    };
    if !c.admin() || scope != Scope::Admin {
        let text = "read-only: sign in as admin (console.admin_token) to act";
        return (StatusCode::FORBIDDEN, pages::message("Read-only", text)).into_response();
    }
    if !c.token_ok(&form.token) {
        let text = "the admin token is wrong; nothing was done";
        return (StatusCode::FORBIDDEN, pages::message("Refused", text)).into_response();
    }
    let which = (id.as_str(), form.queue.as_deref());
    let done = crate::dead::settle(&c.settings, &c.publisher, &c.store, which, action, "console");
    match done.await {
        // 303 to a page that reads the action's record: refreshing it does not act again.
        Ok(recorded) => {
            Redirect::to(&format!("/queues?action={}", recorded.action)).into_response()
        }
        Err(e) => failed(e).into_response(),
    }
}

async fn actions(State(c): State<Arc<Console>>, Extension(scope): Extension<Scope>) -> Page {
    everyone(&scope)?;
    let rows = c.store.actions(500).await.map_err(failed)?;
    Ok(pages::actions(&rows))
}
