//! The registry type: stages in pipeline order, checked by the compiler. `then::<S>` only
//! compiles when `S` consumes what the stage before it produces, and the chain only finishes
//! with a stage that consumes round trips. Stages are built lazily, only in the process that
//! runs them.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Ledger, Route, Runner, Stage};
use crate::broker::{Handler, StageName, Topology};
use crate::messages::{Done, EndedRoundTrip, Submission};

/// What a process offers the stages it builds.
pub trait Context {
    /// Queue names (without the stage list; the chain adds it).
    fn topology(&self) -> Topology;
    /// Outbox and redelivery bookkeeping.
    fn ledger(&self) -> Arc<dyn Ledger>;
}

type Make<C> = Arc<dyn Fn(&C, Route) -> Arc<dyn Handler> + Send + Sync>;

struct Link<C> {
    name: StageName,
    make: Make<C>,
}

/// The pipeline's stages, in order.
pub struct Chain<C> {
    links: Vec<Link<C>>,
}

impl<C: Context + 'static> std::fmt::Debug for Chain<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// A chain being built; `Last` is what its last stage produces.
pub struct Builder<C, Last> {
    links: Vec<Link<C>>,
    last: PhantomData<fn() -> Last>,
}

impl<C, Last> std::fmt::Debug for Builder<C, Last> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.links.iter().map(|l| l.name)).finish()
    }
}

fn link<C: Context + 'static, S: Stage>(build: fn(&C) -> S) -> Link<C> {
    let make: Make<C> = Arc::new(move |cx: &C, route: Route| {
        Arc::new(Runner::new(build(cx), route, cx.ledger())) as _
    });
    Link { name: StageName::new(S::NAME), make }
}

impl<C: Context + 'static> Chain<C> {
    /// Starts a chain with the stage that consumes clients' submissions.
    pub fn ingress<S: Stage<In = Submission>>(build: fn(&C) -> S) -> Builder<C, S::Out> {
        Builder { links: vec![link(build)], last: PhantomData }
    }

    /// Stage names in order.
    pub fn names(&self) -> Vec<StageName> {
        self.links.iter().map(|l| l.name).collect()
    }

    /// The stage called `name`, if the chain has one.
    pub fn find(&self, name: &str) -> Option<StageName> {
        self.links.iter().map(|l| l.name).find(|n| n.as_str() == name)
    }

    /// Queue names with this chain's stages.
    pub fn topology(&self, cx: &C) -> Topology {
        cx.topology().with_stages(&self.names())
    }

    /// Where stage `name`'s outputs go (`None` if the chain has no such stage).
    pub fn route(&self, name: StageName, cx: &C) -> Option<Route> {
        let at = self.links.iter().position(|l| l.name == name)?;
        let names = self.names();
        Some(Route {
            stage: name,
            next: names.get(at + 1).copied(),
            start: names.get(1).copied().unwrap_or(name),
            finisher: *names.last()?,
            topology: self.topology(cx),
        })
    }

    /// Builds the runtime handler of stage `name` (`None` if the chain has no such stage).
    pub fn handler(&self, name: StageName, cx: &C) -> Option<Arc<dyn Handler>> {
        let at = self.links.iter().position(|l| l.name == name)?;
        Some((self.links[at].make)(cx, self.route(name, cx)?))
    }
}

impl<C: Context + 'static, Last> Builder<C, Last> {
    /// Adds a stage that consumes what the chain's last stage produces.
    pub fn then<S: Stage<In = Last>>(mut self, build: fn(&C) -> S) -> Builder<C, S::Out> {
        self.links.push(link(build));
        Builder { links: self.links, last: PhantomData }
    }
}

impl<C: Context + 'static> Builder<C, EndedRoundTrip> {
    /// Ends the chain with the stage that ends round trips (records and replies).
    pub fn finish<S: Stage<In = EndedRoundTrip, Out = Done>>(
        mut self,
        build: fn(&C) -> S,
    ) -> Chain<C> {
        self.links.push(link(build));
        Chain { links: self.links }
    }
}
