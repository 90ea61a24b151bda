//! Every SQL statement the process runs, as sqlx reports it (its `sqlx::query` events, one per
//! statement executed, BEGIN and COMMIT included), counted by a tracing layer installed as the
//! process's subscriber.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Statements that belong to no turn: the ingress roster's heartbeat and the parked replies'
/// redelivery pass, which run on a timer whatever the traffic.
const BACKGROUND: [&str; 2] = ["ingress_members", "undelivered"];

/// The statements run so far, in order.
#[derive(Clone, Default)]
pub struct Statements(Arc<Mutex<Vec<String>>>);

impl Statements {
    /// The counter, installed as the process's subscriber by the first call: every test of
    /// the binary calls this before anything else can set one.
    pub fn install() -> Statements {
        static INSTALLED: OnceLock<Statements> = OnceLock::new();
        INSTALLED
            .get_or_init(|| {
                let statements = Statements::default();
                let subscriber = tracing_subscriber::registry().with(Counter(statements.clone()));
                tracing::subscriber::set_global_default(subscriber)
                    .expect("no subscriber is set yet");
                statements
            })
            .clone()
    }

    /// How many have run.
    pub fn snapshot(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Those run after `before` ([`Statements::snapshot`]).
    pub fn since(&self, before: &usize) -> Ran {
        Ran(self.0.lock().unwrap()[*before..].to_vec())
    }
}

/// A stretch of statements.
pub struct Ran(Vec<String>);

impl Ran {
    /// The statements of turns: all but the background ones.
    pub fn turn_statements(&self) -> usize {
        self.0.iter().filter(|s| !BACKGROUND.iter().any(|b| s.contains(b))).count()
    }

    /// Each statement's count, most frequent first, for a failure message.
    pub fn table(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &self.0 {
            *counts.entry(s.as_str()).or_default() += 1;
        }
        let mut rows: Vec<_> = counts.into_iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1));
        rows.iter().map(|(s, n)| format!("{n:>5}  {}", one_line(s))).collect::<Vec<_>>().join("\n")
    }
}

fn one_line(sql: &str) -> String {
    let flat: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.chars().take(140).collect()
}

struct Counter(Statements);

impl<S: Subscriber> Layer<S> for Counter {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == "sqlx::query"
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        let sql = if text.statement.trim().is_empty() { text.summary } else { text.statement };
        (self.0).0.lock().unwrap().push(sql);
    }
}

#[derive(Default)]
struct Text {
    summary: String,
    statement: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => value.clone_into(&mut self.summary),
            "db.statement" => value.clone_into(&mut self.statement),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.summary.is_empty() {
            self.summary = format!("{value:?}");
        }
    }
}
