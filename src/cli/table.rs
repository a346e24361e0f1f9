//! Plain-text tables for a person at a terminal, shared by every subcommand that prints rows.
//!
//! Columns are padded to their widest cell (counted in characters) and two spaces apart; the last
//! column is not padded, so no line ends in spaces. This module only formats; it knows no model type.
//!
//! A cell is never printed raw: its text may come from E2B or a sandbox (metadata, names, log
//! messages), so control characters are made visible ([`super::visible::cell`]) whether or not
//! stdout is a terminal, and a cell stays one line. A table is for reading; scripts use `--json`.
use super::visible;

/// Prints a table; see [`render_table`].
pub fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    print!("{}", render_table(headers, &rows));
}

/// A header line, then one line per row, or `(none)` when there are no rows.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    render_table_with(headers, rows, LastColumn::Visible)
}

/// How the last column of a table is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastColumn {
    /// One line, control characters visible, like every other cell.
    Visible,
    /// As it is, byte for byte: only for a stream of log messages printed raw (`steward e2b logs`
    /// to a pipe, or with `--raw`), which scripts read exactly as E2B gave it. The last column is
    /// never padded, so this changes nothing but that column's text.
    Raw,
}

/// Like [`render_table`], with the last column printed as `last` says.
pub fn render_table_with(headers: &[&str], rows: &[Vec<String>], last: LastColumn) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let end = row.len().saturating_sub(1);
            row.iter()
                .enumerate()
                .map(|(i, cell)| match last {
                    LastColumn::Raw if i == end => cell.clone(),
                    _ => visible::cell(cell),
                })
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

/// Prints `key  value` lines with the values aligned; see [`render_pairs`].
pub fn print_pairs(pairs: &[(&str, String)]) {
    print!("{}", render_pairs(pairs));
}

/// `key  value` lines with the values aligned, each value one line with its control characters
/// visible, like a table cell.
pub fn render_pairs(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {}\n", visible::cell(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_leave_the_last_one_ragged() {
        let out = render_table(
            &["ID", "STATE", "NOTE"],
            &[
                vec!["a".into(), "running".into(), "x".into()],
                vec!["bbbb".into(), "paused".into(), "long note".into()],
            ],
        );
        assert_eq!(
            out,
            "ID    STATE    NOTE\na     running  x\nbbbb  paused   long note\n"
        );
        assert_eq!(render_table(&["ID"], &[]), "ID\n(none)\n");
    }

    #[test]
    fn cells_and_values_are_one_line_with_control_characters_visible() {
        let hostile = "x\x1b]52;c;ZXZpbA==\x07\nfake row\u{9b}2J".to_owned();
        let out = render_table(&["KEY", "VALUE"], &[vec!["owner".into(), hostile.clone()]]);
        assert_eq!(
            out,
            "KEY    VALUE\nowner  x^[]52;c;ZXZpbA==^G^Jfake rowM-^[2J\n"
        );
        assert_eq!(
            render_pairs(&[("metadata", hostile), ("cpus", "2".into())]),
            "metadata  x^[]52;c;ZXZpbA==^G^Jfake rowM-^[2J\ncpus      2\n"
        );
    }

    #[test]
    fn widths_count_characters_not_bytes() {
        let out = render_table(
            &["ID", "TEMPLATE", "COST/DAY"],
            &[
                vec!["s1".into(), "café".into(), "$1.20".into()],
                vec!["sandbox2".into(), "base".into(), "$0.05".into()],
            ],
        );
        assert_eq!(
            out,
            "ID        TEMPLATE  COST/DAY\ns1        café      $1.20\nsandbox2  base      $0.05\n"
        );
    }
}
