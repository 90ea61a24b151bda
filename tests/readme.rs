//! The README documents every error code, the client protocol gives each its stage, and the
//! simulator's document names every control command and fault.

// Test helpers fail loudly by design.
#![allow(clippy::unwrap_used)]

use aptix::contracts::ErrorCode;
use aptix::sim::{Control, Fault, Latency};

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn readme_lists_every_error_code() {
    let readme = read("README.md");
    for code in ErrorCode::ALL {
        assert!(readme.contains(&format!("`{}`", code.as_str())), "README is missing {code}");
    }
}

#[test]
fn the_client_protocol_gives_every_error_code_its_stage() {
    let doc = read("docs/client-protocol.md");
    for code in ErrorCode::ALL {
        assert!(
            doc.contains(&format!("| `{}` |", code.as_str())),
            "docs/client-protocol.md is missing {code}"
        );
    }
}

/// One of every fault kind. A new kind stops this match compiling until it is listed (and
/// documented).
fn every_fault() -> Vec<Fault> {
    let all = vec![
        Fault::RateLimit { retry_after_ms: Some(1), retry_after_secs: None },
        Fault::InsufficientQuota,
        Fault::ServerError,
        Fault::Status { status: 503 },
        Fault::Hang,
        Fault::Disconnect,
        Fault::StreamCut { after_events: 1 },
        Fault::StreamStall { after_events: 1 },
    ];
    for fault in &all {
        match fault {
            Fault::RateLimit { .. }
            | Fault::InsufficientQuota
            | Fault::ServerError
            | Fault::Status { .. }
            | Fault::Hang
            | Fault::Disconnect
            | Fault::StreamCut { .. }
            | Fault::StreamStall { .. } => {}
        }
    }
    all
}

/// One of every control command, checked the same way.
fn every_command() -> Vec<Control> {
    let all = vec![
        Control::FailNext { fault: Fault::ServerError, count: 1 },
        Control::FailRandomly { fault: Fault::ServerError, probability: 0.5 },
        Control::ClearFaults,
        Control::SetLatency { latency: Latency::default() },
        Control::ForgetStoredResponses,
        Control::ClearRequestLog,
    ];
    for command in &all {
        match command {
            Control::FailNext { .. }
            | Control::FailRandomly { .. }
            | Control::ClearFaults
            | Control::SetLatency { .. }
            | Control::ForgetStoredResponses
            | Control::ClearRequestLog => {}
        }
    }
    all
}

#[test]
fn the_simulator_doc_describes_every_control_command_and_fault() {
    let doc = read("docs/simulator.md");
    for command in every_command() {
        let name = serde_json::to_value(&command).unwrap()["command"].as_str().unwrap().to_owned();
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "docs/simulator.md is missing the command {name}"
        );
    }
    for fault in every_fault() {
        let kind = serde_json::to_value(&fault).unwrap()["kind"].as_str().unwrap().to_owned();
        assert!(
            doc.contains(&format!("| `{kind}` |")),
            "docs/simulator.md is missing the fault {kind}"
        );
    }
}

/// docs/contract.md §"limits" gives each limit's default: the value `Limits::default()` holds.
#[test]
fn the_contract_gives_the_limits_defaults() {
    let doc = read("docs/contract.md");
    let defaults = serde_json::to_value(aptix::config::Limits::default()).unwrap();
    let rows: Vec<(&str, &str)> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `max_"))
        .filter_map(|l| {
            let (key, rest) = l.split_once("` | ")?;
            Some((key, rest.split([' ', '|']).next()?))
        })
        .collect();
    assert!(rows.len() >= 10, "{rows:?}");
    for (key, value) in rows {
        let key = format!("max_{key}");
        assert_eq!(defaults[&key].to_string(), value, "docs/contract.md: {key}");
    }
}
