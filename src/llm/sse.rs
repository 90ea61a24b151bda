//! A minimal Server-Sent Events decoder: bytes in, the `data` of each complete event out.
//!
//! Only what the Responses API uses: `data:` lines (joined with `\n`), events ended by a blank
//! line, `\n` or `\r\n` line ends, comments (`:`) and other fields (`event:`, `id:`, `retry:`)
//! ignored, since dispatch goes by the JSON `type`. An event cut off by the end of the stream is
//! dropped, as the SSE specification says.

/// The longest line or event data taken: a provider's answer larger than the broker carries
/// (16 MiB) could not be handed on anyway, and an endless one must not fill the worker.
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Why a stream cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SseError {
    /// A line is not UTF-8.
    #[error("stream line is not UTF-8: {0}")]
    NotUtf8(#[from] std::str::Utf8Error),
    /// A line or an event's data passed [`MAX_EVENT_BYTES`].
    #[error("a stream line or event is larger than {} MiB", MAX_EVENT_BYTES >> 20)]
    TooLarge,
}

/// Incremental decoder; feed it chunks as they arrive.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no line end: a long line is scanned once, not again
    /// with every chunk that extends it.
    scanned: usize,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// Adds a chunk and returns the data of every event it completes, in order.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, SseError> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(pos) = self.buf[from..].iter().position(|&b| b == b'\n') {
            let end = from + pos;
            from = end + 1;
            let line = &self.buf[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line = std::str::from_utf8(line)?;
            if line.is_empty() {
                if self.has_data {
                    events.push(std::mem::take(&mut self.data));
                    self.has_data = false;
                }
            } else if let Some(value) = line.strip_prefix("data") {
                if let Some(value) = value.strip_prefix(':').or(value.is_empty().then_some("")) {
                    if self.has_data {
                        self.data.push('\n');
                    }
                    self.data.push_str(value.strip_prefix(' ').unwrap_or(value));
                    self.has_data = true;
                    if self.data.len() > MAX_EVENT_BYTES {
                        return Err(SseError::TooLarge);
                    }
                }
            }
            start = end + 1;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_EVENT_BYTES {
            return Err(SseError::TooLarge);
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_chunks_and_line_ends() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"event: response.created\ndata: {\"a\":").unwrap().is_empty());
        assert_eq!(
            d.push(b"1}\n\n: keepalive\n\r\ndata: x\r\ndata:y\r\n\r\n").unwrap(),
            vec!["{\"a\":1}", "x\ny"]
        );
        // A multi-byte character split between chunks survives.
        let text = "data: é\n\n".as_bytes();
        assert!(d.push(&text[..7]).unwrap().is_empty());
        assert_eq!(d.push(&text[7..]).unwrap(), vec!["é"]);
        // An unterminated event is not emitted.
        assert!(d.push(b"data: partial").unwrap().is_empty());
    }

    #[test]
    fn a_line_without_end_stops_at_the_bound() {
        let mut d = SseDecoder::default();
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..(MAX_EVENT_BYTES >> 20) {
            assert!(d.push(&chunk).unwrap().is_empty());
        }
        assert!(matches!(d.push(b"y"), Err(SseError::TooLarge)));
        // Lines end where they end, after a long one was scanned across chunks.
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: ab").unwrap().is_empty());
        assert!(d.push(b"cd").unwrap().is_empty());
        assert_eq!(d.push(b"\n\ndata: e\n\n").unwrap(), vec!["abcd", "e"]);
    }
}
