//! The failing part of a test run's output: the lines that look like test failures for the
//! common runners (cargo test, pytest, go test, jest and vitest), plus the last lines.
//!
//! Pure text in, lines out: no I/O, no Slack. The result is deduplicated, kept in output order,
//! and bounded in lines and characters, so whatever a suite prints, the alert stays readable
//! and within Slack's limits. Lines that are not next to each other are separated by a `…`
//! line, so a reader sees where output was left out.
use std::collections::BTreeSet;

/// How much of the output the alert shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// At most this many lines (gap markers included).
    pub max_lines: usize,
    /// At most this many characters, newlines included.
    pub max_chars: usize,
    /// A longer line is cut to this many characters.
    pub max_line_chars: usize,
    /// The last lines of the output, always kept.
    pub tail_lines: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_lines: 60,
            max_chars: 2400,
            max_line_chars: 200,
            tail_lines: 8,
        }
    }
}

/// What [`failing_lines`] picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingLines {
    pub lines: Vec<String>,
    /// Whether failure lines were left out to stay within the bounds.
    pub cut: bool,
}

impl FailingLines {
    /// The lines joined with newlines.
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }
}

/// The line that marks a gap between picked lines.
pub const GAP: &str = "…";

/// How many lines after a block's header (a panic's stdout, a failed Go test, a jest `●`)
/// belong to it at most.
const BLOCK_LINES: usize = 12;

/// The failing part of `output` within `bounds`.
pub fn failing_lines(output: &str, bounds: Bounds) -> FailingLines {
    let lines: Vec<String> = output.lines().map(strip_ansi).collect();
    let mut failing = BTreeSet::new();
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index].as_str();
        match kind(line) {
            Kind::Plain => {}
            Kind::Line => {
                failing.insert(index);
            }
            Kind::Block => {
                failing.insert(index);
                // The block's lines: up to the next header, a passing test, two blank lines
                // in a row, or the cap.
                let mut blanks = 0;
                let mut taken = 0;
                for (offset, next) in lines.iter().enumerate().skip(index + 1) {
                    if next.trim().is_empty() {
                        blanks += 1;
                        if blanks == 2 {
                            break;
                        }
                        continue;
                    }
                    blanks = 0;
                    if kind(next) == Kind::Block || ends_block(next) || taken == BLOCK_LINES {
                        break;
                    }
                    // cargo's hint about backtraces is the same in every failure.
                    if next.starts_with("note: run with `RUST_BACKTRACE=") {
                        continue;
                    }
                    failing.insert(offset);
                    taken += 1;
                }
            }
        }
        index += 1;
    }
    let tail_start = last_non_blank_lines_start(&lines, bounds.tail_lines);
    let tail: BTreeSet<usize> = (tail_start..lines.len())
        .filter(|&i| !lines[i].trim().is_empty())
        .collect();
    select(&lines, &failing, &tail, bounds)
}

/// Where the last `n` non-blank lines start.
fn last_non_blank_lines_start(lines: &[String], n: usize) -> usize {
    let mut seen = 0;
    for (i, line) in lines.iter().enumerate().rev() {
        if !line.trim().is_empty() {
            seen += 1;
            if seen == n {
                return i;
            }
        }
    }
    0
}

/// Picks failure lines in order while they fit beside the tail, drops repeats, marks gaps.
fn select(
    lines: &[String],
    failing: &BTreeSet<usize>,
    tail: &BTreeSet<usize>,
    bounds: Bounds,
) -> FailingLines {
    let cut_line = |i: usize| cut_chars(&lines[i], bounds.max_line_chars);
    // The tail is kept whole (unless it alone is over the bounds), so its cost is reserved.
    let mut tail_picked: Vec<usize> = tail.iter().copied().collect();
    let cost = |picked: &[usize]| -> (usize, usize) {
        let chars: usize = picked
            .iter()
            .map(|&i| cut_line(i).chars().count() + 1)
            .sum();
        (picked.len() + 1, chars + GAP.len() + 1)
    };
    while !tail_picked.is_empty() && {
        let (n, c) = cost(&tail_picked);
        n > bounds.max_lines || c > bounds.max_chars
    } {
        tail_picked.remove(0);
    }
    let (mut used_lines, mut used_chars) = cost(&tail_picked);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut picked: BTreeSet<usize> = tail_picked.iter().copied().collect();
    let mut cut = false;
    for &i in failing.iter().filter(|i| !tail.contains(i)) {
        let text = cut_line(i);
        let key = text.trim().to_owned();
        // A repeat of a meaningful line (a failed test's name in a summary list) adds
        // nothing; short lines (`}`, `)`) are kept, they belong to what surrounds them.
        if key.chars().count() >= 8 && !seen.insert(key) {
            continue;
        }
        let extra_lines = 2; // the line, and perhaps a gap before it
        let extra_chars = text.chars().count() + 1 + GAP.len() + 1;
        if used_lines + extra_lines > bounds.max_lines
            || used_chars + extra_chars > bounds.max_chars
        {
            cut = true;
            break;
        }
        used_lines += extra_lines;
        used_chars += extra_chars;
        picked.insert(i);
    }
    // The tail's repeats of picked failure lines are dropped too (a summary printed twice).
    let mut out = Vec::new();
    let mut previous: Option<usize> = None;
    let mut shown: BTreeSet<String> = BTreeSet::new();
    for &i in &picked {
        let text = cut_line(i);
        let key = text.trim().to_owned();
        if key.chars().count() >= 8 && !shown.insert(key) {
            continue;
        }
        // A gap is marked only where printed lines were left out, not blank ones.
        let from = previous.map_or(0, |p| p + 1);
        if lines[from..i].iter().any(|l| !l.trim().is_empty()) {
            out.push(GAP.to_owned());
        }
        out.push(text);
        previous = Some(i);
    }
    FailingLines { lines: out, cut }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Not a failure line.
    Plain,
    /// A failure line on its own.
    Line,
    /// A failure line that heads lines belonging to it (a panic's output, an assertion diff).
    Block,
}

/// A line that starts something else than the failure above it (the next test, a pass).
fn ends_block(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.starts_with("=== ")
        || trimmed.starts_with("--- PASS")
        || trimmed.starts_with("--- SKIP")
        || trimmed.starts_with("ok ")
        || trimmed == "PASS"
        || trimmed.starts_with("PASS ")
        || trimmed.starts_with("✓ ")
        || (trimmed.starts_with("test ") && trimmed.ends_with(" ... ok"))
        || trimmed == "failures:"
}

/// `    retry_test.go:41: message`: a Go test's log line (printed before its `--- FAIL` in `-v`).
fn is_go_test_log(trimmed: &str) -> bool {
    trimmed.split_once("_test.go:").is_some_and(|(file, rest)| {
        !file.contains(' ')
            && rest.split_once(':').is_some_and(|(line, _)| {
                !line.is_empty() && line.chars().all(|c| c.is_ascii_digit())
            })
    })
}

/// What one line of runner output says.
fn kind(line: &str) -> Kind {
    let trimmed = line.trim();
    let trimmed_start = line.trim_start();
    // cargo test
    if trimmed.starts_with("---- ") && trimmed.ends_with(" ----") {
        return Kind::Block;
    }
    if (trimmed.starts_with("test ") && trimmed.ends_with(" ... FAILED"))
        || trimmed.starts_with("test result: FAILED")
        || trimmed.contains("panicked at")
        || trimmed.starts_with("error: test failed")
        || trimmed.starts_with("error: could not compile")
        || trimmed.starts_with("error[E")
    {
        return Kind::Line;
    }
    // pytest
    if trimmed.starts_with("FAILED ") || trimmed.starts_with("ERROR ") {
        return Kind::Line;
    }
    if trimmed_start.starts_with("E ") || trimmed == "E" {
        return Kind::Line;
    }
    if is_banner(trimmed, '=')
        && (trimmed.contains("FAILURES")
            || trimmed.contains("ERRORS")
            || trimmed.contains(" failed")
            || trimmed.contains(" error"))
    {
        return Kind::Line;
    }
    if is_banner(trimmed, '_') {
        return Kind::Line;
    }
    if trimmed.starts_with('>') && trimmed.len() > 1 {
        // pytest's pointer at the failing source line.
        return Kind::Line;
    }
    // go test
    if trimmed_start.starts_with("--- FAIL: ") {
        return Kind::Block;
    }
    if trimmed == "FAIL"
        || trimmed.starts_with("FAIL\t")
        || trimmed.starts_with("panic: ")
        || is_go_test_log(trimmed)
    {
        return Kind::Line;
    }
    // jest / vitest
    if trimmed.starts_with("● ") && !trimmed.starts_with("● Console") {
        return Kind::Block;
    }
    if trimmed.starts_with("✕ ")
        || trimmed.starts_with("× ")
        || trimmed.starts_with("FAIL ")
        || trimmed.contains("Failed Tests ")
    {
        return Kind::Line;
    }
    if (trimmed.starts_with("Tests:") || trimmed.starts_with("Test Suites:"))
        && trimmed.contains("failed")
    {
        return Kind::Line;
    }
    if (trimmed.starts_with("Test Files ") || trimmed.starts_with("Tests "))
        && trimmed.contains("failed")
    {
        return Kind::Line;
    }
    Kind::Plain
}

/// `==== text ====` (or with `_`): a pytest section banner.
fn is_banner(line: &str, fill: char) -> bool {
    let run = |s: &str| s.chars().take_while(|&c| c == fill).count();
    line.len() > 6 && run(line) >= 3 && run(&line.chars().rev().collect::<String>()) >= 3
}

/// Cuts `text` to `max` characters, ending with `…` when anything was dropped.
fn cut_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Drops ANSI escape sequences (colours), which runners print when they think they have a
/// terminal, and carriage returns.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // Parameters and intermediates, then one final byte in @..~.
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(output: &str) -> Vec<String> {
        failing_lines(output, Bounds::default()).lines
    }

    fn has(lines: &[String], wanted: &str) -> bool {
        lines.iter().any(|l| l.contains(wanted))
    }

    const CARGO: &str = "\
   Compiling parser v0.3.1 (/home/user/repo)
    Finished `test` profile [unoptimized + debuginfo] target(s) in 4.21s
     Running unittests src/lib.rs (target/debug/deps/parser-1f2e3d4c5b6a7988)

running 4 tests
test lexer::tests::numbers ... ok
test lexer::tests::strings ... ok
test parser::tests::nested_lists ... FAILED
test parser::tests::empty_input ... ok

failures:

---- parser::tests::nested_lists stdout ----

thread 'parser::tests::nested_lists' panicked at src/parser.rs:212:9:
assertion `left == right` failed
  left: [Int(1), List([Int(2)])]
 right: [Int(1), List([Int(2), Int(3)])]
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    parser::tests::nested_lists

test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.02s

error: test failed, to rerun pass `--lib`
";

    #[test]
    fn cargo_test_failures_keep_the_panic_and_its_assertion() {
        let lines = pick(CARGO);
        assert!(has(&lines, "test parser::tests::nested_lists ... FAILED"));
        assert!(has(&lines, "---- parser::tests::nested_lists stdout ----"));
        assert!(has(&lines, "panicked at src/parser.rs:212:9"));
        assert!(has(&lines, "left: [Int(1), List([Int(2)])]"));
        assert!(has(&lines, "test result: FAILED. 3 passed; 1 failed"));
        assert!(has(&lines, "error: test failed"));
        assert!(!has(&lines, "lexer::tests::numbers"), "{lines:#?}");
        assert!(!has(&lines, "Compiling parser"), "{lines:#?}");
        // In output order.
        let at = |s: &str| lines.iter().position(|l| l.contains(s)).unwrap();
        assert!(at("... FAILED") < at("panicked at") && at("panicked at") < at("test result"));
    }

    const PYTEST: &str = "\
============================= test session starts ==============================
platform linux -- Python 3.12.3, pytest-8.2.0, pluggy-1.5.0
rootdir: /home/user/billing
collected 12 items

tests/test_invoice.py ..F.                                               [ 33%]
tests/test_tax.py ........                                               [100%]

=================================== FAILURES ===================================
____________________________ test_total_with_discount ____________________________

    def test_total_with_discount():
        invoice = Invoice(lines=[Line(100), Line(50)], discount=0.1)
>       assert invoice.total() == 135
E       assert 150.0 == 135
E        +  where 150.0 = <bound method Invoice.total of Invoice(lines=2)>()

tests/test_invoice.py:27: AssertionError
=========================== short test summary info ============================
FAILED tests/test_invoice.py::test_total_with_discount - assert 150.0 == 135
========================= 1 failed, 11 passed in 0.34s =========================
";

    #[test]
    fn pytest_failures_keep_the_section_the_assertion_and_the_summary() {
        let lines = pick(PYTEST);
        assert!(has(&lines, "= FAILURES ="));
        assert!(has(&lines, "_ test_total_with_discount _"));
        assert!(has(&lines, ">       assert invoice.total() == 135"));
        assert!(has(&lines, "E       assert 150.0 == 135"));
        assert!(has(
            &lines,
            "FAILED tests/test_invoice.py::test_total_with_discount"
        ));
        assert!(has(&lines, "1 failed, 11 passed in 0.34s"));
        assert!(!has(&lines, "platform linux"), "{lines:#?}");
    }

    const GO: &str = "\
=== RUN   TestParseDuration
--- PASS: TestParseDuration (0.00s)
=== RUN   TestRetryBackoff
    retry_test.go:41: backoff after 3 attempts = 800ms, want 400ms
    retry_test.go:42: jitter was not applied
--- FAIL: TestRetryBackoff (0.00s)
=== RUN   TestClientTimeout
--- PASS: TestClientTimeout (0.01s)
FAIL
FAIL\tgithub.com/acme/fetcher/internal/retry\t0.014s
ok  \tgithub.com/acme/fetcher/internal/cache\t0.009s
FAIL
";

    #[test]
    fn go_test_failures_keep_the_failed_test_and_the_package() {
        let lines = pick(GO);
        assert!(has(&lines, "--- FAIL: TestRetryBackoff (0.00s)"));
        assert!(has(
            &lines,
            "FAIL\tgithub.com/acme/fetcher/internal/retry\t0.014s"
        ));
        assert!(has(&lines, "backoff after 3 attempts"), "{lines:#?}");
    }

    const GO_SUBTESTS: &str = "\
=== RUN   TestSplit
=== RUN   TestSplit/trailing_sep
    split_test.go:19: Split(\"a,b,\") = [a b], want [a b \"\"]
--- FAIL: TestSplit (0.00s)
    --- FAIL: TestSplit/trailing_sep (0.00s)
FAIL
exit status 1
FAIL\tgithub.com/acme/strs\t0.004s
";

    #[test]
    fn go_subtest_failures_are_kept() {
        let lines = pick(GO_SUBTESTS);
        assert!(has(&lines, "--- FAIL: TestSplit/trailing_sep"));
        assert!(has(&lines, "Split(\"a,b,\")"));
        assert!(has(&lines, "FAIL\tgithub.com/acme/strs"));
    }

    const JEST: &str = "\
 PASS  src/utils/format.test.js
 FAIL  src/cart/cart.test.js
  Cart
    ✓ adds an item (3 ms)
    ✕ applies a coupon once (5 ms)

  ● Cart › applies a coupon once

    expect(received).toBe(expected) // Object.is equality

    Expected: 90
    Received: 81

      22 |     cart.applyCoupon('TEN');
      23 |     cart.applyCoupon('TEN');
    > 24 |     expect(cart.total()).toBe(90);
         |                          ^
      25 |   });

      at Object.toBe (src/cart/cart.test.js:24:26)

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 5 passed, 6 total
Snapshots:   0 total
Time:        1.284 s
Ran all test suites.
";

    #[test]
    fn jest_failures_keep_the_suite_the_test_and_the_expectation() {
        let lines = pick(JEST);
        assert!(has(&lines, "FAIL  src/cart/cart.test.js"));
        assert!(has(&lines, "✕ applies a coupon once"));
        assert!(has(&lines, "● Cart › applies a coupon once"));
        assert!(has(&lines, "expect(received).toBe(expected)"));
        assert!(has(&lines, "Tests:       1 failed, 5 passed, 6 total"));
        assert!(!has(&lines, "✓ adds an item"), "{lines:#?}");
        assert!(!has(&lines, "PASS  src/utils"), "{lines:#?}");
    }

    const VITEST: &str = "\
\u{1b}[31m ❯ src/math.test.ts \u{1b}[2m(3 tests | 1 failed)\u{1b}[22m\u{1b}[39m
   × adds negative numbers 4ms
     → expected -3 to be -1 // Object.is equality

⎯⎯⎯⎯⎯⎯⎯ Failed Tests 1 ⎯⎯⎯⎯⎯⎯⎯

 FAIL  src/math.test.ts > adds negative numbers
AssertionError: expected -3 to be -1 // Object.is equality

 Test Files  1 failed (1)
      Tests  1 failed | 2 passed (3)
   Start at  10:02:11
   Duration  412ms
";

    #[test]
    fn vitest_failures_keep_the_test_and_the_counts_without_colour_codes() {
        let lines = pick(VITEST);
        assert!(has(&lines, "× adds negative numbers"));
        assert!(has(
            &lines,
            "FAIL  src/math.test.ts > adds negative numbers"
        ));
        assert!(has(&lines, "Test Files  1 failed (1)"));
        assert!(lines.iter().all(|l| !l.contains('\u{1b}')), "{lines:#?}");
    }

    #[test]
    fn the_last_lines_are_kept_even_when_nothing_looks_like_a_test_failure() {
        let output = (1..=40)
            .map(|i| format!("step {i}"))
            .chain(["Segmentation fault (core dumped)".to_owned()])
            .collect::<Vec<_>>()
            .join("\n");
        let lines = pick(&output);
        assert_eq!(lines.last().unwrap(), "Segmentation fault (core dumped)");
        assert_eq!(lines[0], GAP);
        assert!(!has(&lines, "step 1\n") && !lines.contains(&"step 1".to_owned()));
    }

    #[test]
    fn repeated_failure_lines_are_shown_once() {
        let output = "FAILED tests/a.py::t1 - boom\n".repeat(30) + "done\n";
        let lines = pick(&output);
        let count = lines.iter().filter(|l| l.contains("FAILED")).count();
        assert_eq!(count, 1, "{lines:#?}");
    }

    #[test]
    fn a_huge_failing_output_stays_within_its_bounds_and_says_it_was_cut() {
        let mut output = String::new();
        for i in 0..5000 {
            output.push_str(&format!("test case_{i} ... FAILED\n"));
        }
        output.push_str(&"x".repeat(10_000));
        output.push('\n');
        let bounds = Bounds::default();
        let picked = failing_lines(&output, bounds);
        assert!(picked.cut);
        assert!(picked.lines.len() <= bounds.max_lines);
        let chars: usize = picked.lines.iter().map(|l| l.chars().count() + 1).sum();
        assert!(chars <= bounds.max_chars, "{chars}");
        assert!(picked.lines[0].contains("case_0"), "first failures first");
        assert!(picked.lines.last().unwrap().ends_with('…'), "long line cut");
    }

    #[test]
    fn cargo_s_backtrace_hint_is_left_out_of_a_failure_block() {
        let mut output = String::from(
            "---- a::t stdout ----\nthread 'a::t' panicked at src/a.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
        );
        for i in 0..20 {
            output.push_str(&format!("test b::t{i} ... ok\n"));
        }
        let lines = pick(&output);
        assert!(has(&lines, "panicked at src/a.rs:3:5") && has(&lines, "boom"));
        assert!(!has(&lines, "RUST_BACKTRACE"), "{lines:#?}");
    }

    #[test]
    fn empty_output_picks_nothing() {
        assert_eq!(
            failing_lines("", Bounds::default()),
            FailingLines {
                lines: vec![],
                cut: false
            }
        );
    }
}
