//! Plain-text tables for the human output of the inspection commands:
//! columns padded to their widest cell, numbers right-aligned.

use crate::out::say;

/// A table: a header and rows of cells.
pub(crate) struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub(crate) fn new(head: Vec<String>) -> Self {
        Table {
            head,
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells print empty).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Prints to stdout.
    pub(crate) fn print(&self) {
        let n = self.head.len();
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let width: Vec<usize> = (0..n)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| cell(r, i).chars().count())
                    .chain(std::iter::once(self.head[i].chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        // A column whose cells all start with a digit is numeric.
        let right: Vec<bool> = (0..n)
            .map(|i| {
                !self.rows.is_empty()
                    && self.rows.iter().all(|r| {
                        let c = cell(r, i);
                        c.starts_with(|ch: char| ch.is_ascii_digit()) || c == "-"
                    })
            })
            .collect();
        let line = |cells: Vec<String>| {
            let parts: Vec<String> = (0..n)
                .map(|i| {
                    let c = cells.get(i).cloned().unwrap_or_default();
                    if right[i] {
                        format!("{c:>w$}", w = width[i])
                    } else {
                        format!("{c:<w$}", w = width[i])
                    }
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        say!("{}", line(self.head.clone()));
        for r in &self.rows {
            say!("{}", line(r.clone()));
        }
    }
}
