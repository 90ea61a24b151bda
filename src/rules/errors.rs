//! The bounded error list a validation builds: at most `limits.max_errors` entries, each with
//! its message and field clipped and free of NUL, plus one `request.too_many_errors` entry that
//! counts what was left out. This is what keeps a hostile request from producing a reply larger
//! than the broker accepts.

use super::ValidationErrors;
use crate::contracts::{ApiError, ErrorCode};

/// Longest `Message` of one error, in characters. Values quoted in it are clipped much shorter
/// where they are quoted; this is the backstop for text that comes from serde.
const MAX_MESSAGE_CHARS: usize = 400;
/// Longest `Field` of one error, in characters (paths name at most an index and two properties;
/// only an unknown property name can make one long).
const MAX_FIELD_CHARS: usize = 160;

/// Errors found so far, bounded.
#[derive(Debug)]
pub(super) struct Errors {
    list: Vec<ApiError>,
    max: usize,
    more: usize,
}

impl Errors {
    /// An empty list that keeps at most `max` errors (`limits.max_errors`).
    pub(super) fn new(max: usize) -> Self {
        Errors { list: Vec::new(), max: max.max(1), more: 0 }
    }

    /// Whether another error would still be listed; callers that would build many errors check
    /// this first and call [`Errors::count_only`] instead.
    pub(super) fn has_room(&self) -> bool {
        self.list.len() < self.max
    }

    /// Counts an error that is not listed.
    pub(super) fn count_only(&mut self) {
        self.more += 1;
    }

    pub(super) fn push(&mut self, mut error: ApiError) {
        if !self.has_room() {
            self.more += 1;
            return;
        }
        error.message = bound(&error.message, MAX_MESSAGE_CHARS);
        error.field = error.field.map(|f| bound(&f, MAX_FIELD_CHARS));
        self.list.push(error);
    }

    pub(super) fn at(
        &mut self,
        code: ErrorCode,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.push(ApiError::at(code, field, message));
    }

    /// A `validation.limit_exceeded` error when `actual > max`; true when so.
    pub(super) fn limit(
        &mut self,
        field: &str,
        what: &str,
        actual: usize,
        key: &str,
        max: usize,
    ) -> bool {
        if actual > max {
            self.at(
                ErrorCode::LimitExceeded,
                field,
                format!("{field} has {actual} {what}; the limit (limits.{key}) is {max}"),
            );
        }
        actual > max
    }

    /// [`Errors::limit`] on the length of `text` in characters (counted only when it may be
    /// over); true when over.
    pub(super) fn chars_limit(&mut self, field: &str, text: &str, key: &str, max: usize) -> bool {
        text.len() > max
            && text.chars().nth(max).is_some()
            && self.limit(field, "characters", text.chars().count(), key, max)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty() && self.more == 0
    }

    /// The list, with the summary entry when errors were left out.
    pub(super) fn finish(mut self) -> ValidationErrors {
        if self.more > 0 {
            self.list.push(ApiError::new(
                ErrorCode::RequestTooManyErrors,
                format!(
                    "{} more problems are not listed; the limit (limits.max_errors) is {}",
                    self.more, self.max
                ),
            ));
        }
        ValidationErrors(self.list)
    }
}

/// `text` cut to `max` characters (with `…`) and with every NUL written as `\0`, so an error can
/// always be stored and sent.
fn bound(text: &str, max: usize) -> String {
    let cut = match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    };
    let mut out = cut.replace('\0', "\\0");
    if cut.len() < text.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_beyond_the_cap_are_counted() {
        let mut e = Errors::new(2);
        for i in 0..5 {
            e.at(ErrorCode::RequestUnknownField, format!("F{i}"), "x");
        }
        let list = e.finish().0;
        assert_eq!(list.len(), 3);
        assert_eq!(list[2].code, ErrorCode::RequestTooManyErrors);
        assert!(list[2].message.starts_with("3 more problems"), "{}", list[2].message);
    }

    #[test]
    fn messages_and_fields_are_bounded_and_nul_free() {
        let mut e = Errors::new(5);
        e.at(ErrorCode::RequestUnknownField, "a\0".repeat(1000), "é\0".repeat(1000));
        let err = &e.finish().0[0];
        assert!(!err.message.contains('\0') && !err.field.as_deref().unwrap_or("").contains('\0'));
        assert!(err.message.chars().count() <= MAX_MESSAGE_CHARS + MAX_MESSAGE_CHARS + 1);
        assert!(err.message.ends_with('…'));
        assert!(err.field.as_deref().is_some_and(|f| f.chars().count() <= 2 * MAX_FIELD_CHARS + 1));
    }
}
