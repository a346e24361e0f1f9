//! Small pure text helpers for Slack messages: mrkdwn escaping, quoting of foreign text,
//! sparklines, human durations, counts, percentages and sizes (one unit per table), monospace
//! tables cut to Slack's limits.
//!
//! Text Steward did not write (an agent's or a person's reason, sandbox metadata, template names
//! from E2B, commit messages, branch and author names, commands, a run's output) reaches Slack
//! only through this file: [`quoted_data`] for a piece of it inside a sentence, [`one_line`] for
//! a plain_text field, [`defuse_code_fence`] for lines inside a code block. That is the one place
//! that decides what foreign text may look like on a card.
//!
//! Nothing here knows about templates or E2B types; it turns numbers and strings into text.
use std::time::Duration;

/// Slack refuses a section whose text is longer than this.
pub const SECTION_TEXT_MAX_CHARS: usize = 3000;
/// Slack refuses a message with more blocks than this.
pub const MESSAGE_MAX_BLOCKS: usize = 50;
/// Room kept free in a section for the code fence and a heading line.
const SECTION_MARGIN_CHARS: usize = 100;

/// Escapes the three characters Slack's mrkdwn treats as control characters.
pub fn escape_mrkdwn(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Length in characters of `text` once mrkdwn-escaped; Slack's limits count the escaped text.
pub fn escaped_len(text: &str) -> usize {
    text.chars()
        .map(|c| match c {
            '&' => 5,
            '<' | '>' => 4,
            _ => 1,
        })
        .sum()
}

/// Shown instead of a backtick in foreign text: Slack has no way to escape one, and inside a
/// code block or code span a backtick (or three) would end it. U+02CB looks the same.
pub const BACKTICK_STAND_IN: char = 'ˋ';
/// Shown instead of each line break when foreign text is put on one line.
pub const LINE_BREAK_MARK: char = '⏎';

/// Characters that are dropped from foreign text: they are invisible or act on the text around
/// them. The C0 and C1 controls (NUL included) and DEL, and the bidirectional controls that can
/// make a line read in another order than it is written (U+061C, U+200E, U+200F,
/// U+202A–U+202E, U+2066–U+2069). Line breaks and tabs are handled by the callers.
fn is_dropped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// Keeps foreign text inside a ``` code block: every backtick becomes [`BACKTICK_STAND_IN`] (so
/// no run of them can close the block, even next to the template's own fence), and control
/// characters are dropped (an escape sequence, a NUL) except line breaks and tabs. `\r\n` and a
/// lone `\r` become `\n`. Inside a code block Slack renders no formatting, emoji or mention.
pub fn defuse_code_fence(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' => out.push(BACKTICK_STAND_IN),
            '\n' | '\t' => out.push(c),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\r' | '\u{2028}' | '\u{2029}' => out.push('\n'),
            c if is_dropped(c) => {}
            c => out.push(c),
        }
    }
    out
}

/// Foreign text as one line of plain text, for a plain_text field or as the start of
/// [`quoted_data`]: trimmed, each line break (`\r\n` counts once) shown as [`LINE_BREAK_MARK`],
/// tabs as spaces, control and bidirectional characters dropped, and at most `max_chars`
/// characters, ending in `…` when cut. Not escaped: mrkdwn needs [`quoted_data`].
pub fn one_line(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' if chars.peek() == Some(&'\n') => {}
            c if is_line_break(c) => out.push(LINE_BREAK_MARK),
            '\t' => out.push(' '),
            c if is_dropped(c) => {}
            c => out.push(c),
        }
    }
    if out.chars().count() > max_chars {
        let mut cut: String = out.chars().take(max_chars.saturating_sub(1)).collect();
        cut.push('…');
        return cut;
    }
    out
}

/// Broadcast words that Slack may turn into a notification of everyone when it parses a message
/// (`@channel`, `@here`, `@everyone`), whatever the case.
const BROADCASTS: [&str; 3] = ["channel", "here", "everyone"];

/// Foreign text as quoted data inside a mrkdwn sentence: one line (see [`one_line`]) in an inline
/// code span, ready to print as mrkdwn (already escaped), at most `max_chars` characters as
/// Slack counts them (escaped) plus the two backticks. Empty text is `“”`.
///
/// Slack's mrkdwn has no escape character, so there are two ways to stop `*bold*`, `_italic_`,
/// `~strike~`, a `>` quote at the start of a line and `:emoji:` shortcodes from rendering:
/// breaking each marker with an invisible character, or a code span. Invisible characters are a
/// guess at Slack's parser (a zero-width space next to `*` is the very trick people use to *force*
/// bold inside a word) and they change what a reader copies. A code span is documented: Slack
/// renders no formatting and no emoji inside one, and it also shows the reader at a glance that
/// this is someone's data, not Steward's words. What a code span cannot hold is handled here: a
/// backtick (which would end it) becomes [`BACKTICK_STAND_IN`], line breaks become
/// [`LINE_BREAK_MARK`], and `&`, `<`, `>` become the entities Slack requires, so no `<!channel>`,
/// `<@U…>` or `<url|label>` can form. A bare `@channel`, `@here` or `@everyone` gets a word joiner
/// (U+2060) after the `@`, so no parsing of plain text turns it into a broadcast either.
pub fn quoted_data(text: &str, max_chars: usize) -> String {
    let line: String = one_line(text, usize::MAX)
        .chars()
        .map(|c| if c == '`' { BACKTICK_STAND_IN } else { c })
        .collect();
    if line.is_empty() {
        return "“”".to_owned();
    }
    let line = truncate_escaped(&line, max_chars);
    let mut out = String::with_capacity(line.len() + 8);
    out.push('`');
    let mut rest = line.as_str();
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '@' => {
                out.push('@');
                let next: String = rest.chars().take(8).collect::<String>().to_lowercase();
                if BROADCASTS.iter().any(|w| next.starts_with(w)) {
                    out.push('\u{2060}');
                }
            }
            c => out.push(c),
        }
    }
    out.push('`');
    out
}

const SPARK: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A one-line chart of `values`, scaled between `floor` and the larger of `ceiling` and the
/// data's maximum. At most `width` characters: longer series are averaged into buckets.
pub fn sparkline(values: &[f64], floor: f64, ceiling: f64, width: usize) -> String {
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let buckets: Vec<f64> = if values.len() <= width {
        values.to_vec()
    } else {
        (0..width)
            .map(|i| {
                let start = i * values.len() / width;
                let end = ((i + 1) * values.len() / width).max(start + 1);
                let slice = &values[start..end];
                slice.iter().sum::<f64>() / slice.len() as f64
            })
            .collect()
    };
    let top = buckets.iter().copied().fold(ceiling, f64::max);
    let span = (top - floor).max(f64::EPSILON);
    buckets
        .iter()
        .map(|v| {
            let ratio = ((v - floor) / span).clamp(0.0, 1.0);
            SPARK[((ratio * 7.0).round() as usize).min(7)]
        })
        .collect()
}

/// Minimum, mean and maximum; `None` for an empty series.
pub fn min_avg_max(values: &[f64]) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let avg = values.iter().sum::<f64>() / values.len() as f64;
    Some((min, avg, max))
}

/// A moment as every Slack message shows it: `2026-12-02 09:00 UTC`.
pub fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// `1 d 3 h`, `2 h 5 min`, `4 min 10 s`, `30 s`: the two largest units, spaced like every other
/// quantity Steward writes, and without a trailing zero part (`2 h`, not `2 h 0 min`).
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (days, hours, mins, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let pair = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big} {big_unit}")
        } else {
            format!("{big} {big_unit} {small} {small_unit}")
        }
    };
    match () {
        _ if days > 0 => pair(days, "d", hours, "h"),
        _ if hours > 0 => pair(hours, "h", mins, "min"),
        _ if mins > 0 => pair(mins, "min", s, "s"),
        _ => format!("{s} s"),
    }
}

/// A duration as someone would type it back into a command: `10m`, `1h30m`, `1s` (exact, no
/// spaces, so `/sandbox timeout i1 1h30m` parses). For prose use [`human_duration`].
pub fn typed_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return "0s".to_owned();
    }
    let parts = [
        (secs / 86400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

/// `1 build`, `2 builds`, `0 builds`: a count with its noun, never `build(s)`. `plural` is the
/// noun for any count but one (`count(3, "sandbox", "sandboxes")`).
pub fn count(n: impl Into<u64>, singular: &str, plural: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// A percentage as Steward writes it, with a space: `2 %`, `12.5 %` (one decimal below 10).
pub fn percent(value: f64) -> String {
    if value.abs() < 10.0 && value.fract().abs() >= 0.05 {
        format!("{value:.1} %")
    } else {
        format!("{value:.0} %")
    }
}

const BYTE_UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// Bytes as `512 MiB`, `1.5 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    let unit = ByteUnit::fitting(bytes);
    format!("{} {}", unit.number(bytes), unit.name())
}

/// One binary unit for a whole table or list, so a column never mixes `512 MiB` with
/// `1.5 GiB`: pick it with [`ByteUnit::fitting`] from the largest value, write the name once
/// (in the header) and the cells with [`ByteUnit::number`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteUnit(usize);

impl ByteUnit {
    /// The largest unit in which `largest` is at least 1.
    pub fn fitting(largest: u64) -> Self {
        let mut value = largest as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < BYTE_UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        Self(unit)
    }

    /// `MiB`, `GiB`, …
    pub fn name(self) -> &'static str {
        BYTE_UNITS[self.0]
    }

    /// `bytes` in this unit without the unit: `1.5`, `512`, `<0.1` for a non-zero amount too
    /// small to show.
    pub fn number(self, bytes: u64) -> String {
        let value = bytes as f64 / 1024f64.powi(self.0 as i32);
        if bytes > 0 && value < 0.05 {
            "<0.1".to_owned()
        } else if self.0 == 0 || value >= 100.0 || value.fract() < 0.05 || value.fract() >= 0.95 {
            format!("{value:.0}")
        } else {
            format!("{value:.1}")
        }
    }
}

/// Lays out rows as a left-aligned monospace table, then cuts the lines into chunks that each
/// fit one section once escaped and fenced. Cells are truncated to `max_cell` characters.
pub fn table(header: &[&str], rows: &[Vec<String>], max_cell: usize) -> Vec<String> {
    let cut = |s: &str| -> String {
        if s.chars().count() > max_cell {
            let mut t: String = s.chars().take(max_cell.saturating_sub(1)).collect();
            t.push('…');
            t
        } else {
            s.to_owned()
        }
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| cut(&defuse_code_fence(&one_line(c, usize::MAX))))
                .collect()
        })
        .collect();
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate().take(columns) {
            out.push_str(cell);
            if i + 1 < columns {
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.trim_end().to_owned()
    };
    let mut lines = vec![line(&header)];
    lines.extend(rows.iter().map(|r| line(r)));
    chunk_lines(&lines, SECTION_TEXT_MAX_CHARS - SECTION_MARGIN_CHARS)
}

/// Joins lines with newlines into chunks whose escaped length stays within `max_chars`.
/// A single line longer than the limit is cut.
pub fn chunk_lines(lines: &[String], max_chars: usize) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut current_len = 0;
    for line in lines {
        let line = truncate_escaped(line, max_chars);
        let len = escaped_len(&line);
        if !current.is_empty() && current_len + 1 + len > max_chars {
            chunks.push(std::mem::take(&mut current));
            current_len = 0;
        }
        if !current.is_empty() {
            current.push('\n');
            current_len += 1;
        }
        current.push_str(&line);
        current_len += len;
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Cuts `text` so its escaped length is at most `max_chars`, marking the cut with `…`.
pub fn truncate_escaped(text: &str, max_chars: usize) -> String {
    if escaped_len(text) <= max_chars {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut len = 0;
    for c in text.chars() {
        let l = escaped_len(c.encode_utf8(&mut [0; 4]));
        if len + l + 1 > max_chars {
            break;
        }
        out.push(c);
        len += l;
    }
    out.push('…');
    out
}

/// What a cut text ends with, so readers know there was more.
pub const CUT_MARK: &str = "…(cut)";

/// Cuts user text so that, once mrkdwn-escaped, it is at most `max_chars` characters, ending
/// with [`CUT_MARK`] when anything was dropped. Applied before rendering, so a template never
/// fails on the length of what a person typed.
pub fn cut(text: &str, max_chars: usize) -> String {
    if escaped_len(text) <= max_chars {
        return text.to_owned();
    }
    let room = max_chars.saturating_sub(CUT_MARK.chars().count());
    let mut out = String::new();
    let mut len = 0;
    for c in text.chars() {
        let l = escaped_len(c.encode_utf8(&mut [0; 4]));
        if len + l > room {
            break;
        }
        out.push(c);
        len += l;
    }
    out.push_str(CUT_MARK);
    out
}

/// Whether `url` can be the target of a Slack link (`<url|text>`): `http(s)://`, no whitespace
/// or control characters, nothing that would end the link early (`|`, `<`, `>`).
pub fn is_link_target(url: &str) -> bool {
    (url.starts_with("https://") || url.starts_with("http://"))
        && url
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '|' | '<' | '>'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_short_text_and_marks_long_text_within_the_escaped_limit() {
        assert_eq!(cut("short", 10), "short");
        let long = "<&>".repeat(2000);
        let got = cut(&long, 3000);
        assert!(got.ends_with(CUT_MARK));
        assert!(escaped_len(&got) <= 3000, "{}", escaped_len(&got));
        assert!(escaped_len(&got) > 2980);
    }

    /// The kill reason of issue 39: card lines a person would believe.
    const FAKE_CARD_LINES: &str =
        "\n:white_check_mark: *Steward recommends Kill*…\n*State*\nstopped";

    #[test]
    fn quoted_data_is_one_escaped_line_in_a_code_span() {
        assert_eq!(
            quoted_data(FAKE_CARD_LINES, 200),
            "`:white_check_mark: *Steward recommends Kill*…⏎*State*⏎stopped`"
        );
        assert_eq!(
            quoted_data("<!channel> & <@U0002> <https://evil.example|here>", 200),
            "`&lt;!channel&gt; &amp; &lt;@U0002&gt; &lt;https://evil.example|here&gt;`"
        );
        // NUL, escape sequences, bidirectional overrides and carriage returns are dropped or
        // become one line; a backtick cannot end the span.
        assert_eq!(
            quoted_data("a\0b\x1b[2J\u{202e}c\r\nd\re\tf ``` g`", 200),
            "`ab[2Jc⏎d⏎e f ˋˋˋ gˋ`"
        );
        assert_eq!(quoted_data(" \n\t\0 ", 200), "“”");
        // A bare broadcast word cannot be parsed into one; other @s stay as they are.
        assert_eq!(
            quoted_data("@channel @Here @everyone bob@example.com", 200),
            "`@\u{2060}channel @\u{2060}Here @\u{2060}everyone bob@example.com`"
        );
    }

    #[test]
    fn quoted_data_is_cut_to_its_escaped_length() {
        let long = "<&>".repeat(1000);
        let quoted = quoted_data(&long, 300);
        assert!(quoted.starts_with("`&lt;&amp;&gt;"), "{quoted}");
        assert!(quoted.ends_with("…`"), "{quoted}");
        assert!(quoted.chars().count() <= 302, "{}", quoted.chars().count());
        assert!(quoted.chars().count() > 290, "{}", quoted.chars().count());
        assert_eq!(quoted_data("short", 300), "`short`");
    }

    #[test]
    fn one_line_drops_controls_marks_breaks_and_cuts() {
        assert_eq!(
            one_line(FAKE_CARD_LINES, 100),
            ":white_check_mark: *Steward recommends Kill*…⏎*State*⏎stopped"
        );
        assert_eq!(one_line("a\u{2028}b\u{85}c\x07", 100), "a⏎b⏎c");
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("abcd", 4), "abcd");
    }

    #[test]
    fn code_block_text_keeps_its_lines_and_cannot_close_the_block() {
        assert_eq!(
            defuse_code_fence("ok ```\r\nrm `x`\x1b[31m red\0\nlast``"),
            "ok ˋˋˋ\nrm ˋxˋ[31m red\nlastˋˋ"
        );
        // Whatever it ends with, the template's closing fence is the first ``` after it.
        for text in ["`", "``", "```", "a````"] {
            let block = format!("```{}```", defuse_code_fence(text));
            assert_eq!(block.matches("```").count(), 2, "{block}");
        }
    }

    #[test]
    fn mrkdwn_control_characters_are_escaped() {
        assert_eq!(
            escape_mrkdwn("a<b>&c <@U1>"),
            "a&lt;b&gt;&amp;c &lt;@U1&gt;"
        );
        assert_eq!(escaped_len("a<&"), 10);
    }

    #[test]
    fn sparklines_scale_between_floor_and_ceiling() {
        assert_eq!(sparkline(&[0.0, 50.0, 100.0], 0.0, 100.0, 10), "▁▅█");
        assert_eq!(sparkline(&[], 0.0, 100.0, 10), "");
        let long: Vec<f64> = (0..100).map(f64::from).collect();
        assert_eq!(sparkline(&long, 0.0, 1.0, 8).chars().count(), 8);
    }

    #[test]
    fn durations_and_sizes_read_naturally() {
        assert_eq!(human_duration(Duration::from_secs(12)), "12 s");
        assert_eq!(human_duration(Duration::from_secs(30)), "30 s");
        assert_eq!(human_duration(Duration::from_secs(250)), "4 min 10 s");
        assert_eq!(human_duration(Duration::from_secs(600)), "10 min");
        assert_eq!(human_duration(Duration::from_secs(7500)), "2 h 5 min");
        assert_eq!(human_duration(Duration::from_secs(7200)), "2 h");
        assert_eq!(human_duration(Duration::from_secs(86400)), "1 d");
        assert_eq!(human_duration(Duration::from_secs(97200)), "1 d 3 h");
        assert_eq!(human_bytes(512 * 1024 * 1024), "512 MiB");
        assert_eq!(human_bytes(1536 * 1024 * 1024), "1.5 GiB");
        assert_eq!(human_bytes(1024 * 1024 * 1024), "1 GiB");
        assert_eq!(typed_duration(Duration::from_secs(1)), "1s");
        assert_eq!(typed_duration(Duration::from_secs(600)), "10m");
        assert_eq!(typed_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(typed_duration(Duration::from_secs(90000)), "1d1h");
        for secs in [1, 59, 600, 5400, 90000, 97261] {
            let typed = typed_duration(Duration::from_secs(secs));
            assert_eq!(
                crate::duration::parse("t", &typed).unwrap(),
                Duration::from_secs(secs)
            );
        }
        assert_eq!(count(1u32, "build", "builds"), "1 build");
        assert_eq!(count(0u32, "build", "builds"), "0 builds");
        assert_eq!(count(3u32, "sandbox", "sandboxes"), "3 sandboxes");
        assert_eq!(percent(2.0), "2 %");
        assert_eq!(percent(1.54), "1.5 %");
        assert_eq!(percent(87.4), "87 %");
    }

    #[test]
    fn a_table_writes_every_size_in_one_unit() {
        const MIB: u64 = 1024 * 1024;
        let unit = ByteUnit::fitting(20 * 1024 * MIB);
        assert_eq!(unit.name(), "GiB");
        assert_eq!(unit.number(512 * MIB), "0.5");
        assert_eq!(unit.number(20 * 1024 * MIB), "20");
        assert_eq!(unit.number(3 * MIB), "<0.1");
        assert_eq!(unit.number(0), "0");
        assert_eq!(ByteUnit::fitting(900 * MIB).name(), "MiB");
    }

    #[test]
    fn tables_align_columns_and_split_within_section_limits() {
        let rows: Vec<Vec<String>> = (0..200)
            .map(|i| vec![format!("i{i}"), "base & <x>".into()])
            .collect();
        let chunks = table(&["id", "template"], &rows, 30);
        assert!(chunks.len() > 1);
        assert!(chunks[0].starts_with("id    template\ni0    base & <x>"));
        for c in &chunks {
            assert!(escaped_len(c) <= SECTION_TEXT_MAX_CHARS - 100);
        }
        assert_eq!(chunks.iter().map(|c| c.lines().count()).sum::<usize>(), 201);
    }

    #[test]
    fn truncation_counts_escaped_characters() {
        let t = truncate_escaped(&"<".repeat(100), 21);
        assert_eq!(t, "<<<<<…");
        assert!(escaped_len(&t) <= 21);
    }
}
