//! Text from a sandbox, an agent or E2B made safe to print on the operator's terminal: control
//! characters shown the way `cat -v` (and `less`) show them, so no escape sequence in foreign text
//! can write the clipboard (`ESC ]52`), retitle the window, clear the screen or move the cursor.
//!
//! `ESC` becomes `^[`, the other C0 controls `^@`…`^_`, `DEL` `^?`, the C1 controls U+0080–U+009F
//! (U+009B is an 8-bit CSI to many terminals) `M-^@`…`M-^_`, and bytes that are not UTF-8 `M-x` as
//! `cat -v` writes a high byte. Everything else, non-ASCII letters included, prints as it is.
//! [`Layout::Keep`] leaves line feeds and tabs alone (a stream of output keeps its lines);
//! [`Layout::OneLine`] shows them too (`^J`, `^I`), for a table cell that must stay one row.
//!
//! Pure: no I/O; whether to apply it (a terminal, `--raw`) is the caller's decision.

/// Whether line feeds and tabs are kept or shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `\n` and `\t` print as they are: a stream of lines.
    Keep,
    /// `\n` and `\t` show as `^J` and `^I`: one table cell, one line.
    OneLine,
}

/// `text` with every control character made visible; see the module's documentation.
pub fn visible(text: &str, layout: Layout) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_char(&mut out, c, layout);
    }
    out
}

/// A table cell as a terminal may show it: one line, control characters visible.
pub fn cell(text: &str) -> String {
    visible(text, Layout::OneLine)
}

/// Makes a byte stream visible chunk by chunk: a UTF-8 character split between two chunks is
/// held back until its end arrives, so it prints as the character and not as two bad bytes.
#[derive(Debug)]
pub struct Stream {
    layout: Layout,
    /// The start of a character whose remaining bytes have not arrived yet (at most 3 bytes).
    held: Vec<u8>,
}

impl Stream {
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            held: Vec::new(),
        }
    }

    /// The visible form of everything up to the end of `bytes`, except an unfinished character.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let mut input = std::mem::take(&mut self.held);
        input.extend_from_slice(bytes);
        let mut out = String::with_capacity(input.len());
        let mut rest = input.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    push_str(&mut out, text, self.layout);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` promises that prefix is UTF-8.
                    push_str(
                        &mut out,
                        std::str::from_utf8(good).unwrap_or_default(),
                        self.layout,
                    );
                    match e.error_len() {
                        Some(len) => {
                            for &b in &bad[..len] {
                                push_byte(&mut out, b);
                            }
                            rest = &bad[len..];
                        }
                        // The input ends inside a character: wait for the rest of it.
                        None => {
                            self.held = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// What is still held at the end of the stream (a character that never ended), shown.
    pub fn finish(self) -> String {
        let mut out = String::new();
        for &b in &self.held {
            push_byte(&mut out, b);
        }
        out
    }
}

fn push_str(out: &mut String, text: &str, layout: Layout) {
    for c in text.chars() {
        push_char(out, c, layout);
    }
}

/// `^X` for the C0 control `c` (below 0x20) or DEL.
fn caret(out: &mut String, c: u8) {
    out.push('^');
    out.push(if c == 0x7f { '?' } else { char::from(c + 0x40) });
}

fn push_char(out: &mut String, c: char, layout: Layout) {
    match c {
        '\n' | '\t' if layout == Layout::Keep => out.push(c),
        '\0'..='\x1f' | '\x7f' => caret(out, c as u8),
        '\u{80}'..='\u{9f}' => {
            out.push_str("M-");
            caret(out, c as u8 - 0x80);
        }
        c => out.push(c),
    }
}

/// A byte that is not part of any UTF-8 character, as `cat -v` shows a high byte: `M-` and the
/// visible form of its low seven bits.
fn push_byte(out: &mut String, b: u8) {
    if b < 0x80 {
        // Never reached for UTF-8 errors (ASCII is always valid), kept for completeness.
        caret_or_char(out, b);
        return;
    }
    out.push_str("M-");
    caret_or_char(out, b - 0x80);
}

fn caret_or_char(out: &mut String, b: u8) {
    if b < 0x20 || b == 0x7f {
        caret(out, b);
    } else {
        out.push(char::from(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chunks: &[&[u8]], layout: Layout) -> String {
        let mut s = Stream::new(layout);
        let mut out: String = chunks.iter().map(|c| s.push(c)).collect();
        out.push_str(&s.finish());
        out
    }

    #[test]
    fn escape_sequences_show_as_cat_v_shows_them() {
        // A clipboard write, a window title and a screen clear, as a hostile sandbox prints them.
        let hostile = "\x1b]52;c;ZXZpbA==\x07\x1b]0;owned\x07\x1b[2J\x1b[H";
        assert_eq!(
            visible(hostile, Layout::Keep),
            "^[]52;c;ZXZpbA==^G^[]0;owned^G^[[2J^[[H"
        );
        assert_eq!(visible("a\0b\x7fc\rd", Layout::Keep), "a^@b^?c^Md");
        assert_eq!(visible("\x01\x1f", Layout::Keep), "^A^_");
    }

    #[test]
    fn line_feeds_and_tabs_stay_in_a_stream_and_show_in_a_cell() {
        assert_eq!(
            visible("one\ttwo\nthree\n", Layout::Keep),
            "one\ttwo\nthree\n"
        );
        assert_eq!(cell("one\ttwo\nthree"), "one^Itwo^Jthree");
    }

    #[test]
    fn c1_controls_show_with_m_and_letters_print_as_they_are() {
        // U+009B is a one-character CSI to a terminal that honours 8-bit controls.
        assert_eq!(visible("\u{9b}2J", Layout::Keep), "M-^[2J");
        assert_eq!(visible("\u{80}\u{9f}", Layout::Keep), "M-^@M-^_");
        assert_eq!(
            visible("café ✓ 日本 \u{a0}", Layout::Keep),
            "café ✓ 日本 \u{a0}"
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_show_as_high_bytes() {
        assert_eq!(stream(&[b"a\xffb\xc3("], Layout::Keep), "aM-^?bM-C(");
        assert_eq!(stream(&[b"\x9b"], Layout::Keep), "M-^[");
        // A character cut off at the very end of the stream.
        assert_eq!(stream(&[b"ok\xe2\x9c"], Layout::Keep), "okM-bM-^\\");
    }

    #[test]
    fn a_character_split_across_chunks_prints_whole() {
        let text = "é✓\x1b[31m";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(stream(&[a, b], Layout::Keep), "é✓^[[31m", "cut at {cut}");
        }
        // Byte by byte too.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(stream(&singles, Layout::Keep), "é✓^[[31m");
    }

    #[test]
    fn nothing_visible_is_left_that_a_terminal_would_act_on() {
        let every_byte: Vec<u8> = (0u8..=255).collect();
        let shown = stream(&[&every_byte], Layout::OneLine);
        assert!(
            shown
                .chars()
                .all(|c| !c.is_control() && c != '\u{1b}' && c != '\u{7f}'),
            "{shown:?}"
        );
        let every_char: String = ('\0'..='\u{2ff}').collect();
        let shown = cell(&every_char);
        assert!(shown.chars().all(|c| !c.is_control()), "{shown:?}");
    }
}
