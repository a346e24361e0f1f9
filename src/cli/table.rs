//! Plain-text tables for a person at a terminal, shared by every subcommand that prints rows.
//!
//! Columns are padded to their widest cell (counted in characters) and two spaces apart; the last
//! column is not padded, so no line ends in spaces. This module only formats; it knows no model type.

/// Prints a table; see [`render_table`].
pub fn print_table(headers: &[&str], rows: Vec<Vec<String>>) {
    print!("{}", render_table(headers, &rows));
}

/// A header line, then one line per row, or `(none)` when there are no rows.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
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
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

/// Prints `key  value` lines with the values aligned.
pub fn print_pairs(pairs: &[(&str, String)]) {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs {
        println!("{k:<width$}  {v}");
    }
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
