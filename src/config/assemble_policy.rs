//! The knobs of the delta policy (Session Architecture §5, §9): the active-file size limit, the
//! provider's retention of chained responses, and the budgets that bound what a new chain is
//! rehydrated with (and, so, how much history a session stores).

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

/// Policy for assembling requests; the `[assemble]` configuration section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AssemblePolicy {
    /// Active files larger than this many bytes are not sent: they are listed in the record's
    /// skipped files and the final response carries a user warning.
    pub active_file_max_bytes: u64,
    /// Days after which the provider may have forgotten a response, so a new chain is started
    /// instead of chaining onto it.
    pub retention_days: u32,
    /// Characters of earlier turns (instructions and final outputs) a new chain is rehydrated
    /// with; the newest turns are kept first.
    pub rehydrate_transcript_chars: usize,
    /// Characters of earlier retrieved chunks a new chain is rehydrated with.
    pub rehydrate_chunk_chars: usize,
    /// Characters of earlier active files (latest versions) a new chain is rehydrated with.
    pub rehydrate_file_chars: usize,
    /// What the request's `prompt_cache_key` is: the provider routes a request to a cache
    /// machine by its prompt's first tokens and this key.
    pub prompt_cache_key: PromptCacheKey,
}

/// The `prompt_cache_key` a `/responses` request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptCacheKey {
    /// One key per session (a digest of its `SessionId`): the session's calls, which share
    /// their chain as a prefix, land on the machine that holds it, while sessions that share only
    /// a boot prompt no longer crowd one machine (docs/benchmarks.md, "Prompt caching").
    #[default]
    Session,
    /// No key: the provider routes by the prompt's first tokens alone.
    Off,
}

impl Default for AssemblePolicy {
    fn default() -> Self {
        AssemblePolicy {
            active_file_max_bytes: 100 * 1024,
            retention_days: 30,
            rehydrate_transcript_chars: 32_000,
            rehydrate_chunk_chars: 48_000,
            rehydrate_file_chars: 300_000,
            prompt_cache_key: PromptCacheKey::Session,
        }
    }
}

impl AssemblePolicy {
    /// When a response created at `at` can no longer be chained onto.
    pub fn expires_at(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        at + TimeDelta::days(i64::from(self.retention_days))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_session_architecture() {
        let p = AssemblePolicy::default();
        assert_eq!(p.active_file_max_bytes, 102_400);
        assert_eq!(p.retention_days, 30);
        let empty: AssemblePolicy = toml::from_str("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(empty, p);
    }

    #[test]
    fn built_in_configuration_matches_the_defaults() {
        let defaults: toml::Table =
            toml::from_str(crate::config::DEFAULTS_TOML).unwrap_or_else(|e| panic!("{e}"));
        let section =
            defaults.get("assemble").cloned().unwrap_or_else(|| panic!("no [assemble] section"));
        let policy: AssemblePolicy = section.try_into().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy, AssemblePolicy::default());
    }
}
