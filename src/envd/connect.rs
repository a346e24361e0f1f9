//! A pure, incremental decoder for Connect server-streaming bodies with the JSON codec.
//!
//! Each message is an envelope: one flag byte, a big-endian `u32` length, then that many bytes of
//! JSON. A frame whose flags carry [`END_STREAM_FLAG`] is the last one and holds `{}` or
//! `{"error":{"code","message"}}`. Chunks from the network cut frames anywhere, so the decoder keeps
//! what it has not yet finished and hands out whole frames only. It does no I/O and refuses a frame
//! longer than its cap before buffering it, so a broken or hostile peer cannot make it hold more.
use bytes::{Buf, Bytes, BytesMut};
use serde::Deserialize;

/// Flag bit marking the end-of-stream frame.
pub const END_STREAM_FLAG: u8 = 0x02;
/// Flag bit marking a compressed frame; we never ask for compression, so such a frame is refused.
pub const COMPRESSED_FLAG: u8 = 0x01;
/// Bytes in an envelope header: flags plus length.
pub const HEADER_BYTES: usize = 5;
/// Default cap on one frame's body. envd sends output in small chunks; 4 MiB leaves room.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// One whole frame, decoded from the envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A data frame: one JSON message, not yet parsed into a type.
    Message(Bytes),
    /// The end-of-stream frame; `error` is set when the server ended the call with an error.
    End { error: Option<ConnectError> },
}

/// The error a Connect server puts in its end-of-stream frame (or in a unary error body).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConnectError {
    /// A Connect code such as `unavailable` or `not_found`.
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// Why a byte stream is not a well-formed Connect stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a Connect frame announced {announced} bytes, more than the {cap}-byte cap")]
    TooLarge { announced: usize, cap: usize },
    #[error("a Connect frame arrived compressed, but no compression was asked for")]
    Compressed,
    #[error("the Connect end-of-stream frame is not valid JSON: {0}")]
    BadEnd(String),
    #[error("the Connect stream went on after its end-of-stream frame")]
    AfterEnd,
    #[error("the Connect stream stopped in the middle of a frame ({buffered} bytes left over)")]
    Truncated { buffered: usize },
}

/// Incremental decoder: [`push`](Self::push) chunks in, take frames out with
/// [`next_frame`](Self::next_frame), and call [`finish`](Self::finish) when the body ends.
#[derive(Debug)]
pub struct Decoder {
    buffer: BytesMut,
    max_frame_bytes: usize,
    ended: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

#[derive(Deserialize)]
struct EndBody {
    #[serde(default)]
    error: Option<ConnectError>,
}

impl Decoder {
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_frame_bytes,
            ended: false,
        }
    }

    /// Appends one chunk as it came off the wire.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole frame, `Ok(None)` when more bytes are needed. The length is checked against
    /// the cap as soon as the header is complete, before the body is waited for.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buffer.len() < HEADER_BYTES {
            if self.ended && !self.buffer.is_empty() {
                return Err(FrameError::AfterEnd);
            }
            return Ok(None);
        }
        if self.ended {
            return Err(FrameError::AfterEnd);
        }
        let flags = self.buffer[0];
        let announced = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if announced > self.max_frame_bytes {
            return Err(FrameError::TooLarge {
                announced,
                cap: self.max_frame_bytes,
            });
        }
        if flags & COMPRESSED_FLAG != 0 {
            return Err(FrameError::Compressed);
        }
        if self.buffer.len() < HEADER_BYTES + announced {
            return Ok(None);
        }
        self.buffer.advance(HEADER_BYTES);
        let body = self.buffer.split_to(announced).freeze();
        if flags & END_STREAM_FLAG == 0 {
            return Ok(Some(Frame::Message(body)));
        }
        self.ended = true;
        let error = if body.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            serde_json::from_slice::<EndBody>(&body)
                .map_err(|e| FrameError::BadEnd(e.to_string()))?
                .error
        };
        Ok(Some(Frame::End { error }))
    }

    /// Called when the body has ended: leftover bytes mean the stream was cut mid-frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffer.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buffer.len(),
            })
        }
    }

    /// Whether the end-of-stream frame has been seen.
    pub fn ended(&self) -> bool {
        self.ended
    }
}

/// Wraps one JSON message in a data-frame envelope (requests are framed the same way).
pub fn encode(flags: u8, message: &[u8]) -> Vec<u8> {
    let length = u32::try_from(message.len()).expect("a request message is far below 4 GiB");
    let mut out = Vec::with_capacity(HEADER_BYTES + message.len());
    out.push(flags);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(message);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(decoder: &mut Decoder) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("well-formed stream") {
            out.push(frame);
        }
        out
    }

    fn message(json: &str) -> Frame {
        Frame::Message(Bytes::copy_from_slice(json.as_bytes()))
    }

    #[test]
    fn a_whole_frame_in_one_chunk_decodes() {
        let mut decoder = Decoder::default();
        decoder.push(&encode(0, br#"{"event":{"keepalive":{}}}"#));
        assert_eq!(
            frames(&mut decoder),
            [message(r#"{"event":{"keepalive":{}}}"#)]
        );
        decoder.finish().unwrap();
    }

    #[test]
    fn a_header_split_across_chunks_waits_for_the_rest() {
        let wire = encode(0, b"{\"a\":1}");
        let mut decoder = Decoder::default();
        decoder.push(&wire[..3]);
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.push(&wire[3..]);
        assert_eq!(frames(&mut decoder), [message("{\"a\":1}")]);
    }

    #[test]
    fn a_body_split_across_chunks_waits_for_the_rest() {
        let wire = encode(0, b"{\"hello\":\"world\"}");
        let mut decoder = Decoder::default();
        decoder.push(&wire[..9]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert!(
            decoder.finish().is_err(),
            "half a frame is not a finished stream"
        );
        decoder.push(&wire[9..]);
        assert_eq!(frames(&mut decoder), [message("{\"hello\":\"world\"}")]);
        decoder.finish().unwrap();
    }

    #[test]
    fn two_frames_in_one_chunk_both_decode_in_order() {
        let mut wire = encode(0, b"{\"n\":1}");
        wire.extend(encode(0, b"{\"n\":2}"));
        wire.extend(encode(END_STREAM_FLAG, b"{}"));
        let mut decoder = Decoder::default();
        decoder.push(&wire);
        assert_eq!(
            frames(&mut decoder),
            [
                message("{\"n\":1}"),
                message("{\"n\":2}"),
                Frame::End { error: None }
            ]
        );
        assert!(decoder.ended());
    }

    #[test]
    fn byte_by_byte_delivery_gives_the_same_frames() {
        let mut wire = encode(0, b"{\"n\":1}");
        wire.extend(encode(END_STREAM_FLAG, b"{}"));
        let mut decoder = Decoder::default();
        let mut out = Vec::new();
        for byte in &wire {
            decoder.push(std::slice::from_ref(byte));
            out.extend(frames(&mut decoder));
        }
        assert_eq!(out, [message("{\"n\":1}"), Frame::End { error: None }]);
    }

    #[test]
    fn end_stream_without_error_is_a_clean_end() {
        for body in [&b"{}"[..], b""] {
            let mut decoder = Decoder::default();
            decoder.push(&encode(END_STREAM_FLAG, body));
            assert_eq!(frames(&mut decoder), [Frame::End { error: None }]);
        }
    }

    #[test]
    fn end_stream_with_error_carries_code_and_message() {
        let mut decoder = Decoder::default();
        decoder.push(&encode(
            END_STREAM_FLAG,
            br#"{"error":{"code":"not_found","message":"process with pid 7 not found"}}"#,
        ));
        assert_eq!(
            frames(&mut decoder),
            [Frame::End {
                error: Some(ConnectError {
                    code: "not_found".into(),
                    message: "process with pid 7 not found".into()
                })
            }]
        );
    }

    #[test]
    fn an_oversize_frame_is_refused_from_its_header_alone() {
        let mut decoder = Decoder::new(16);
        // Only the header: the cap is enforced before any of the body is buffered.
        decoder.push(&[0, 0, 0, 0, 17]);
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLarge {
                announced: 17,
                cap: 16
            })
        );
        let mut at_cap = Decoder::new(16);
        at_cap.push(&encode(0, &[b' '; 16]));
        assert!(matches!(at_cap.next_frame(), Ok(Some(Frame::Message(_)))));
    }

    #[test]
    fn a_compressed_frame_is_refused() {
        let mut decoder = Decoder::default();
        decoder.push(&encode(COMPRESSED_FLAG, b"xx"));
        assert_eq!(decoder.next_frame(), Err(FrameError::Compressed));
    }

    #[test]
    fn bytes_after_the_end_frame_are_refused() {
        let mut wire = encode(END_STREAM_FLAG, b"{}");
        wire.extend(encode(0, b"{}"));
        let mut decoder = Decoder::default();
        decoder.push(&wire);
        assert_eq!(decoder.next_frame(), Ok(Some(Frame::End { error: None })));
        assert_eq!(decoder.next_frame(), Err(FrameError::AfterEnd));
    }

    #[test]
    fn an_end_frame_that_is_not_json_is_refused() {
        let mut decoder = Decoder::default();
        decoder.push(&encode(END_STREAM_FLAG, b"not json"));
        assert!(matches!(decoder.next_frame(), Err(FrameError::BadEnd(_))));
    }
}
