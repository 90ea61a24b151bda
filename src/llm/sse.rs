//! A minimal Server-Sent Events decoder: bytes in, the `data` of each complete event out.
//!
//! Only what the Responses API uses: `data:` lines (joined with `\n`), events ended by a blank
//! line, `\n` or `\r\n` line ends, comments (`:`) and other fields (`event:`, `id:`, `retry:`)
//! ignored, since dispatch goes by the JSON `type`. An event cut off by the end of the stream is
//! dropped, as the SSE specification says.

/// Incremental decoder; feed it chunks as they arrive.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    buf: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseDecoder {
    /// Adds a chunk and returns the data of every event it completes, in order.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<Vec<String>, std::str::Utf8Error> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
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
                }
            }
            start = end + 1;
        }
        self.buf.drain(..start);
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
}
