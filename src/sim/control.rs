//! Control commands: what a test, benchmark or operator changes in a running simulator, in
//! process ([`super::SimHandle::control`]) or as the JSON body of `POST /_sim/control`
//! (documented in `docs/simulator.md`).
//!
//! Reading is strict: an unknown command, fault kind or field, a missing field or an
//! out-of-range value is refused with a message that names it, so a typo in a test's fault
//! plan fails loudly instead of arming nothing. serde's `deny_unknown_fields` cannot see the
//! fields of a unit variant of an internally tagged enum (it ignores them), so commands and
//! faults are read through wire enums whose variants are all structs, then converted.

use serde::{Deserialize, Serialize};

use super::faults::{Fault, Latency};
use super::state::SimState;

/// A control command, e.g. `{"command":"fail_next","fault":{"kind":"server_error"},"count":2}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", try_from = "ControlWire")]
pub enum Control {
    /// The next `count` requests get `fault`.
    FailNext {
        /// The fault.
        fault: Fault,
        /// How many requests.
        count: usize,
    },
    /// Each request gets `fault` with `probability`.
    FailRandomly {
        /// The fault.
        fault: Fault,
        /// 0-1; 0 disarms it.
        probability: f64,
    },
    /// Disarm all faults.
    ClearFaults,
    /// Replace the latency settings.
    SetLatency {
        /// The new latency.
        latency: Latency,
    },
    /// Forget every stored response (chains break with `previous_response_not_found`).
    ForgetStoredResponses,
    /// Empty the request log.
    ClearRequestLog,
}

impl Control {
    pub(super) fn apply(self, st: &SimState) {
        match self {
            Control::FailNext { fault, count } => st.faults.fail_next(fault, count),
            Control::FailRandomly { fault, probability } => {
                st.faults.fail_randomly(fault, probability)
            }
            Control::ClearFaults => st.faults.clear(),
            Control::SetLatency { latency } => st.latency.set(latency),
            Control::ForgetStoredResponses => st.forget_all(),
            Control::ClearRequestLog => st.clear_log(),
        }
    }

    /// Reads a command from a JSON body; the error says what is wrong with it.
    pub fn from_json(body: &[u8]) -> Result<Control, serde_json::Error> {
        serde_json::from_slice(body)
    }
}

#[derive(Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
enum ControlWire {
    FailNext { fault: Fault, count: usize },
    FailRandomly { fault: Fault, probability: f64 },
    ClearFaults {},
    SetLatency { latency: Latency },
    ForgetStoredResponses {},
    ClearRequestLog {},
}

impl TryFrom<ControlWire> for Control {
    type Error = String;

    fn try_from(w: ControlWire) -> Result<Self, Self::Error> {
        Ok(match w {
            ControlWire::FailNext { fault, count } => Control::FailNext { fault, count },
            ControlWire::FailRandomly { fault, probability } => {
                if !(0.0..=1.0).contains(&probability) {
                    return Err(format!(
                        "`probability` must be between 0 and 1, got {probability}"
                    ));
                }
                Control::FailRandomly { fault, probability }
            }
            ControlWire::ClearFaults {} => Control::ClearFaults,
            ControlWire::SetLatency { latency } => Control::SetLatency { latency },
            ControlWire::ForgetStoredResponses {} => Control::ForgetStoredResponses,
            ControlWire::ClearRequestLog {} => Control::ClearRequestLog,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_fault() -> Vec<Fault> {
        vec![
            Fault::RateLimit { retry_after_ms: Some(50), retry_after_secs: None },
            Fault::InsufficientQuota,
            Fault::ServerError,
            Fault::Status { status: 503 },
            Fault::Hang,
            Fault::Disconnect,
            Fault::StreamCut { after_events: 3 },
            Fault::StreamStall { after_events: 2 },
        ]
    }

    #[test]
    fn every_command_and_fault_reads_back_what_it_writes() {
        let mut commands = vec![
            Control::ClearFaults,
            Control::SetLatency { latency: Latency { fixed_ms: 5, jitter_ms: 1, per_event_ms: 2 } },
            Control::ForgetStoredResponses,
            Control::ClearRequestLog,
        ];
        for fault in every_fault() {
            commands.push(Control::FailNext { fault: fault.clone(), count: 2 });
            commands.push(Control::FailRandomly { fault, probability: 0.5 });
        }
        for command in commands {
            let json = serde_json::to_vec(&command).unwrap_or_default();
            assert_eq!(Control::from_json(&json).ok(), Some(command));
        }
    }

    #[test]
    fn unknown_fields_and_bad_values_are_named() {
        let cases = [
            (r#"{"command":"clear_faults","all":true}"#, "unknown field `all`"),
            (
                r#"{"command":"fail_next","fault":{"kind":"hang","for_ms":5},"count":1}"#,
                "unknown field `for_ms`",
            ),
            (
                r#"{"command":"fail_next","fault":{"kind":"server_error"},"cuont":1}"#,
                "unknown field `cuont`",
            ),
            (r#"{"command":"set_latency","latency":{"fixed":5}}"#, "unknown field `fixed`"),
            (r#"{"command":"fail_nxt"}"#, "unknown variant `fail_nxt`"),
            (r#"{"command":"fail_next","fault":{"kind":"server_error"}}"#, "missing field `count`"),
            (
                r#"{"command":"fail_randomly","fault":{"kind":"hang"},"probability":2}"#,
                "between 0 and 1",
            ),
            (
                r#"{"command":"fail_next","fault":{"kind":"status","status":42},"count":1}"#,
                "between 100 and 599",
            ),
        ];
        for (body, expected) in cases {
            match Control::from_json(body.as_bytes()) {
                Ok(c) => panic!("{body} was accepted as {c:?}"),
                Err(message) => {
                    assert!(message.to_string().contains(expected), "{body}: {message}")
                }
            }
        }
    }
}
