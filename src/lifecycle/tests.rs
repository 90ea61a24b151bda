//! The turn's life as a table: every allowed transition written out by hand, every other pair
//! of (phase, event) refused, and the stored form read back into the same phase.

use super::{events, phases, table, transition, Event, HostEnd, Phase, StepEnd};

fn running(step: i32) -> Phase {
    Phase::Running { step, cancelling: false }
}

fn cancelling(step: i32) -> Phase {
    Phase::Running { step, cancelling: true }
}

/// Every allowed transition of the representative phases, by hand.
fn allowed() -> Vec<(Option<Phase>, Event, Phase)> {
    use Event as E;
    use Phase as P;
    use StepEnd as S;
    let mut t = vec![
        (None, E::Admitted { busy: false, room: true }, running(0)),
        (None, E::Admitted { busy: false, room: false }, P::Held),
        (None, E::Admitted { busy: true, room: true }, P::Queued),
        (None, E::Admitted { busy: true, room: false }, P::Queued),
        (Some(P::Queued), E::Dispatched { room: true }, running(0)),
        (Some(P::Queued), E::Dispatched { room: false }, P::Held),
        (Some(P::Queued), E::Cancel, P::Cancelled),
        (Some(P::Queued), E::GivenUp, P::Failed),
        (Some(P::Queued), E::Steered, P::Steered),
        (Some(P::Steered), E::HostEnded(HostEnd::Completed), P::Completed),
        (Some(P::Steered), E::HostEnded(HostEnd::Failed), P::Failed),
        (Some(P::Steered), E::HostEnded(HostEnd::Cancelled), P::Cancelled),
        (Some(P::Held), E::RoomFreed, running(0)),
        (Some(P::Held), E::Cancel, P::Cancelled),
        (Some(P::Held), E::GivenUp, P::Failed),
        (Some(P::AwaitingTools { step: 1 }), E::ToolResults { matching: true }, running(1)),
        (Some(P::AwaitingTools { step: 1 }), E::ToolResults { matching: false }, P::Failed),
        (Some(P::AwaitingTools { step: 1 }), E::Cancel, P::Cancelled),
        (Some(P::AwaitingTools { step: 1 }), E::GivenUp, P::Failed),
        (Some(P::AwaitingApproval { step: 1 }), E::Approvals { matching: true }, running(1)),
        (Some(P::AwaitingApproval { step: 1 }), E::Approvals { matching: false }, P::Failed),
        (Some(P::AwaitingApproval { step: 1 }), E::ApprovalExpired, running(1)),
        (Some(P::AwaitingApproval { step: 1 }), E::Cancel, P::Cancelled),
        (Some(P::AwaitingApproval { step: 1 }), E::GivenUp, P::Failed),
    ];
    for step in [0, 1] {
        t.extend([
            (Some(running(step)), E::StepEnded(S::Final), P::Completed),
            (Some(running(step)), E::StepEnded(S::Error), P::Failed),
            (
                Some(running(step)),
                E::StepEnded(S::ClientTools),
                P::AwaitingTools { step: step + 1 },
            ),
            (Some(running(step)), E::StepEnded(S::ServerTools), running(step + 1)),
            (
                Some(running(step)),
                E::StepEnded(S::ApprovalRequired),
                P::AwaitingApproval { step: step + 1 },
            ),
            (Some(running(step)), E::Cancel, cancelling(step)),
            (Some(running(step)), E::GivenUp, P::Failed),
            (Some(cancelling(step)), E::StepEnded(S::Cancelled), P::Cancelled),
            (Some(cancelling(step)), E::GivenUp, P::Cancelled),
        ]);
    }
    t
}

#[test]
fn every_allowed_transition_goes_where_the_table_says_and_every_other_is_refused() {
    let allowed = allowed();
    let mut checked = 0;
    for from in phases() {
        for event in events() {
            let expected = allowed.iter().find(|(f, e, _)| *f == from && *e == event);
            match (transition(from, event), expected) {
                (Ok(to), Some((_, _, want))) => assert_eq!(to, *want, "{from:?} on {event}"),
                (Ok(to), None) => panic!("{from:?} on {event} went to {to}; the table refuses it"),
                (Err(r), Some((_, _, want))) => panic!("{r}; the table goes to {want}"),
                (Err(r), None) => assert_eq!((r.from, r.event), (from, event)),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, phases().len() * events().len());
    // Each hand-written row names a representative phase and event, so none is unchecked.
    for (from, event, _) in &allowed {
        assert!(phases().contains(from) && events().contains(event), "{from:?} {event}");
    }
}

#[test]
fn an_ended_turn_never_moves_again() {
    for end in [Phase::Completed, Phase::Failed, Phase::Cancelled] {
        assert!(end.has_ended());
        for event in events() {
            assert!(transition(Some(end), event).is_err(), "{end} moved on {event}");
        }
    }
}

#[test]
fn the_cancel_mark_once_set_is_never_cleared() {
    for from in phases().into_iter().flatten().filter(|p| p.cancel_marked()) {
        for event in events() {
            if let Ok(to) = transition(Some(from), event) {
                assert!(to.cancel_marked(), "{from} on {event} went to {to}");
            }
        }
    }
}

#[test]
fn a_phase_reads_back_from_its_stored_form() {
    for phase in phases().into_iter().flatten() {
        let (step, active) = match phase {
            Phase::Running { step, .. }
            | Phase::AwaitingTools { step }
            | Phase::AwaitingApproval { step } => (step, true),
            Phase::Held => (0, true),
            _ => (0, false),
        };
        let read = Phase::stored(phase.column(), active, step, phase.cancel_marked());
        assert_eq!(read, phase);
    }
}

#[test]
fn the_architecture_doc_prints_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md");
    let doc = std::fs::read_to_string(path).unwrap_or_default();
    let printed = doc
        .split("<!-- lifecycle:begin -->\n")
        .nth(1)
        .and_then(|rest| rest.split("<!-- lifecycle:end -->").next())
        .unwrap_or_default();
    assert_eq!(
        printed,
        table(),
        "docs/architecture.md's turn table differs from lifecycle::table()"
    );
}
