//! Adding a stage is one file and one registry line: a rerank stage between retrieve and
//! assemble, written here as a user of the library would, runs in a real pipeline (RabbitMQ,
//! PostgreSQL, the embedded store, the simulator) and its work reaches the client.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use aptix::contracts::UserWarning;
use aptix::messages::RetrievedTurn;
use aptix::stage::{Chain, Output, Stage, StageError};
use aptix::stages::{admit, assemble, invoke, persist, retrieve, Deps};
use common::{new_session, user_turn, Harness};

/// Reorders retrieved chunks: by path, then by line, and says so in a warning.
#[derive(Debug)]
struct Rerank;

impl Rerank {
    fn new(_: &Deps) -> Self {
        Rerank
    }
}

impl Stage for Rerank {
    const NAME: &'static str = "rerank";
    type In = RetrievedTurn;
    type Out = RetrievedTurn;

    async fn run(&self, mut job: RetrievedTurn) -> Result<Output<RetrievedTurn>, StageError> {
        job.chunks.sort_by(|a, b| (&a.path, a.start_line).cmp(&(&b.path, b.start_line)));
        job.warnings.push(UserWarning {
            code: "rerank.applied".into(),
            message: format!("{} chunks reordered by path", job.chunks.len()),
        });
        Ok(Output::Next(job))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_added_between_retrieve_and_assemble_runs_in_the_pipeline() {
    let mut h = Harness::start(0).await;
    // The registry of `aptix::stages::chain`, with one more line.
    let chain = Chain::ingress(admit::Admit::new)
        .then(retrieve::Retrieve::new)
        .then(Rerank::new)
        .then(assemble::Assemble::new)
        .then(invoke::Invoke::new)
        .finish(persist::Persist::new);
    let names: Vec<&str> = chain.names().iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["validate", "retrieve", "rerank", "assemble", "invoke", "persist"]);
    h.run_chain(chain, 1);
    let s = new_session();
    h.submit(&user_turn(
        &s,
        "t1",
        "How is the invoice e-mail sent, and how is VAT computed for an invoice line?",
    ))
    .await;
    let replies = h.replies(&s, 1, Duration::from_secs(60)).await;
    let reply = &replies.last().expect("a reply").body;
    assert_eq!(reply["Successful"], true, "{reply}");
    let warnings = reply["Result"]["UserWarnings"].as_array().unwrap();
    assert!(warnings.iter().any(|w| w["Code"] == "rerank.applied"), "{reply}");
    let records = h.records(&s).await;
    let chunks = records[0]["retrieved_chunks"].as_array().unwrap();
    assert!(!chunks.is_empty(), "the fixture repository has context for this question");
    let paths: Vec<&str> = chunks.iter().map(|c| c["path"].as_str().unwrap()).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "assembled in the reranked order");
    let ch = h.conn.create_channel().await.unwrap();
    let _ = ch
        .queue_delete(format!("{}.rerank", h.topology.prefix()).as_str().into(), Default::default())
        .await;
    h.teardown().await;
}

/// A stage with a bug that one turn's content sets off; in `give_up` too when `twice`.
#[derive(Debug)]
struct Buggy {
    twice: bool,
}

impl Buggy {
    fn new(_: &Deps) -> Self {
        Buggy { twice: false }
    }

    fn twice(_: &Deps) -> Self {
        Buggy { twice: true }
    }
}

/// The pipeline with `buggy` (made by it) between retrieve and assemble.
fn with_buggy(buggy: fn(&Deps) -> Buggy) -> Chain<Deps> {
    Chain::ingress(admit::Admit::new)
        .then(retrieve::Retrieve::new)
        .then(buggy)
        .then(assemble::Assemble::new)
        .then(invoke::Invoke::new)
        .finish(persist::Persist::new)
}

fn met_by(job: &RetrievedTurn) -> bool {
    serde_json::to_string(&job.admitted).unwrap().contains(TRIGGER)
}

/// What sets the bug off.
const TRIGGER: &str = "sets-off-the-bug-4f1e";

impl Stage for Buggy {
    const NAME: &'static str = "buggy";
    type In = RetrievedTurn;
    type Out = RetrievedTurn;

    async fn run(&self, job: RetrievedTurn) -> Result<Output<RetrievedTurn>, StageError> {
        assert!(!met_by(&job), "a bug met by this turn");
        Ok(Output::Next(job))
    }

    async fn give_up(
        &self,
        job: RetrievedTurn,
        error: aptix::contracts::ApiError,
    ) -> Result<Output<RetrievedTurn>, StageError> {
        assert!(!(self.twice && met_by(&job)), "the same bug, met giving up");
        Ok(Output::Finish(aptix::stage::Inbound::fail(job, vec![error])))
    }
}

/// A message whose handling panics is returned to the broker as if its worker had died: it is
/// redelivered, counted and given up, its turn answered; it holds no prefetch slot and stops
/// nobody. (Unacked after the panic, it held its slot until the worker restarted, and the
/// session never heard of its turn.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_whose_handling_panics_is_given_up_and_holds_nothing() {
    let mut h = Harness::start_with(0, |s| {
        s.pipeline.max_redeliveries = 2;
        s.pipeline.prefetch.0.insert("buggy".into(), 1);
    })
    .await;
    h.run_chain(with_buggy(Buggy::new), 1);
    let hit = new_session();
    h.submit(&user_turn(&hit, "t1", &format!("this one {TRIGGER}"))).await;
    // With a prefetch of 1, a slot held by the first would stop this one.
    let other = new_session();
    h.submit(&user_turn(&other, "t1", "and this one?")).await;
    let replies = h.replies(&other, 1, Duration::from_secs(60)).await;
    assert_eq!(replies.last().expect("a reply").body["Successful"], true);
    let replies = h.replies(&hit, 1, Duration::from_secs(60)).await;
    let reply = &replies.last().expect("the turn that set the bug off is answered").body;
    assert_eq!(reply["Successful"], false, "{reply}");
    let dead = h.dead_letters().await;
    assert_eq!(dead.len(), 1, "given up once: {dead:?}");
    let ch = h.conn.create_channel().await.unwrap();
    let _ = ch
        .queue_delete(format!("{}.buggy", h.topology.prefix()).as_str().into(), Default::default())
        .await;
    h.teardown().await;
}

/// A message whose stage panics giving it up too (the same bug) is given up once, its turn ended
/// without the stage (its client answered), rather than handled and given up again for ever (a
/// queue with no delivery limit would).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_whose_giving_up_panics_too_is_dead_lettered_once() {
    let mut h = Harness::start_with(0, |s| {
        s.pipeline.max_redeliveries = 1;
    })
    .await;
    h.run_chain(with_buggy(Buggy::twice), 1);
    let hit = new_session();
    h.submit(&user_turn(&hit, "t1", &format!("this one {TRIGGER}"))).await;
    let replies = h.replies(&hit, 1, Duration::from_secs(60)).await;
    let reply = &replies.last().expect("the turn is answered").body;
    assert_eq!(reply["Successful"], false, "{reply}");
    let other = new_session();
    h.submit(&user_turn(&other, "t1", "and this one?")).await;
    let replies = h.replies(&other, 1, Duration::from_secs(60)).await;
    assert_eq!(replies.last().expect("a reply").body["Successful"], true);
    assert_eq!(h.dead_letters().await.len(), 1, "given up once");
    let buggy = format!("{}.buggy", h.topology.prefix());
    assert_eq!(h.peek_count(&buggy).await, 0, "nothing left to loop");
    let ch = h.conn.create_channel().await.unwrap();
    let _ = ch.queue_delete(buggy.as_str().into(), Default::default()).await;
    h.teardown().await;
}
