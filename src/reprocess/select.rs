//! Which stored turns a run covers: a session, a time window, a list of turns, or all of them.
//! The list (`--turns FILE`) has one turn per line, either `SESSION_ID TURN_ID` (whitespace or a
//! comma between) or a JSON object `{"SessionId": …, "TurnId": …}` (JSON lines); blank lines and
//! lines starting with `#` are ignored.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::ReprocessError;
use crate::contracts::{SessionId, TurnId};
use crate::store::TurnSelector;

/// The turns to reprocess. Every condition given must hold; with none, `all` must be set so a
/// run over the whole database is never an accident.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only this session.
    pub session: Option<SessionId>,
    /// Turns first answered at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Turns first answered before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only these turns.
    pub turns: Option<Vec<(SessionId, TurnId)>>,
    /// Every stored turn (when no other condition is given).
    pub all: bool,
}

impl Selection {
    /// The store query for this selection, after checking it selects deliberately.
    pub fn to_selector(&self) -> Result<TurnSelector, ReprocessError> {
        let narrowed = self.session.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.turns.is_some();
        if !narrowed && !self.all {
            return Err(ReprocessError::Options(
                "select turns with --session, --since, --until or --turns (or --all for every stored turn)"
                    .into(),
            ));
        }
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if since >= until {
                return Err(ReprocessError::Options(format!(
                    "--since {since} is not before --until {until}"
                )));
            }
        }
        Ok(TurnSelector {
            session: self.session.map(|s| s.as_uuid()),
            since: self.since,
            until: self.until,
            turns: self.turns.as_ref().map(|list| {
                list.iter().map(|(s, t)| (s.as_uuid(), t.as_str().to_owned())).collect()
            }),
        })
    }
}

/// Parses a turn list; errors name the line.
pub fn parse_turn_list(text: &str) -> Result<Vec<(SessionId, TurnId)>, ReprocessError> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, line) in (1..).zip(text.lines()) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |message: String| ReprocessError::TurnList { line: n, message };
        let (session, turn) = if line.starts_with('{') {
            json_pair(line).map_err(|e| bad(e.to_string()))?
        } else {
            let fields: Vec<&str> = line
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|f| !f.is_empty())
                .collect();
            match fields[..] {
                [s, t] => (s.to_owned(), t.to_owned()),
                _ => {
                    return Err(bad(format!(
                        "expected `SESSION_ID TURN_ID`, found {} fields",
                        fields.len()
                    )))
                }
            }
        };
        let session: SessionId = session.parse().map_err(|(_, m): (_, String)| bad(m))?;
        let turn: TurnId = turn.parse().map_err(|(_, m): (_, String)| bad(m))?;
        if seen.insert((session, turn.clone())) {
            out.push((session, turn));
        }
    }
    Ok(out)
}

/// `{"SessionId": …, "TurnId": …}` (snake_case keys are accepted too).
fn json_pair(line: &str) -> Result<(String, String), PairError> {
    let v: Value = serde_json::from_str(line)?;
    let field = |names: [&'static str; 2]| {
        names
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str))
            .map(str::to_owned)
            .ok_or(PairError::Missing(names[0]))
    };
    Ok((field(["SessionId", "session_id"])?, field(["TurnId", "turn_id"])?))
}

/// Reads an RFC 3339 time (`2025-01-31T12:00:00Z`) or a date (`2025-01-31`, midnight UTC).
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, BadTime> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .ok_or_else(|| BadTime(text.to_owned()))
}

/// A JSON line of a turn list that is not a session and turn pair.
#[derive(Debug, thiserror::Error)]
enum PairError {
    /// Not JSON.
    #[error("not a JSON object: {0}")]
    Json(#[from] serde_json::Error),
    /// A field is missing.
    #[error("`{0}` is missing or not a string")]
    Missing(&'static str),
}

/// A time option that is neither an RFC 3339 time nor a date.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not an RFC 3339 time (2025-01-31T12:00:00Z) or a date (2025-01-31)")]
pub struct BadTime(String);

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "6f1c1b7e-8a53-4c1e-9d55-0c6f3c2b9a10";

    #[test]
    fn reads_pairs_json_lines_comments_and_dedupes() {
        let text = format!(
            "# turns\n{S} t1\n\n{S},t2\n{{\"SessionId\":\"{S}\",\"TurnId\":\"t3\"}}\n{{\"session_id\":\"{S}\",\"turn_id\":\"t1\"}}\n"
        );
        let list = parse_turn_list(&text).unwrap();
        let turns: Vec<&str> = list.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(turns, ["t1", "t2", "t3"]);
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse_turn_list(&format!("{S} t1\nnot-a-uuid t2\n")).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = parse_turn_list(&format!("{S} t1 extra\n")).unwrap_err();
        assert!(err.to_string().contains("3 fields"), "{err}");
        let err = parse_turn_list("{\"SessionId\": 1}\n").unwrap_err();
        assert!(err.to_string().contains("SessionId"), "{err}");
    }

    #[test]
    fn an_unnarrowed_selection_needs_all() {
        assert!(Selection::default().to_selector().is_err());
        assert!(Selection { all: true, ..Selection::default() }.to_selector().is_ok());
        let t = |s| parse_time(s).unwrap();
        let window = Selection {
            since: Some(t("2025-02-01")),
            until: Some(t("2025-01-01T00:00:00Z")),
            ..Selection::default()
        };
        assert!(window.to_selector().is_err());
        assert!(parse_time("yesterday").is_err());
    }
}
