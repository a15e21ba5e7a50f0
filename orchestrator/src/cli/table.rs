//! Tables that fit the reader's terminal.
//!
//! A table is built column by column ([`Grid`]), each column with its cells, optionally a
//! compact form of them (a time of day instead of a full timestamp) and a minimum width if its
//! text may be cut (errors, details). Given a width, [`Grid::render`] applies the table's own
//! plan of [`Fit`] steps (compact this column, then drop that one) until the columns fit, and
//! lets comfy-table cut the cuttable cells to one line ending in `…`. Columns marked whole (the
//! saga id, which people copy) are never cut. Without a width (output to a pipe or a file) every
//! column is shown in full, so `grep` sees everything.

use std::io::IsTerminal;

use comfy_table::{
    presets, Cell, CellAlignment, Color, ColumnConstraint, ContentArrangement, Row, Table,
};
use unicode_width::UnicodeWidthStr;

/// Where output goes: how wide it may be, and whether it may be coloured.
///
/// [`Layout::plain`] (no width limit, no colour) is right for anything but a person's
/// terminal; [`Layout::for_stdout`] looks at the process's standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    /// The widest a line may be, in terminal columns; `None` for no limit.
    pub width: Option<u16>,
    /// Whether statuses are coloured (ANSI escape codes).
    pub colour: bool,
}

/// The narrowest width honoured: below it the tables could not show an id.
const MIN_WIDTH: u16 = 40;

impl Layout {
    /// No width limit and no colour: for pipes, files and tests.
    pub fn plain() -> Self {
        Self::default()
    }

    /// The layout for standard output: the width from `COLUMNS` if it is set to a number, else
    /// the terminal's if standard output is one, else no limit (a pipe or a file keeps every
    /// column whole). Colour only on a terminal, and never when `NO_COLOR` is set.
    pub fn for_stdout() -> Self {
        let tty = std::io::stdout().is_terminal();
        let from_env = std::env::var("COLUMNS")
            .ok()
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|w| *w > 0);
        // comfy-table asks the terminal (crossterm) when standard output is one.
        let width = from_env.or_else(|| if tty { Table::new().width() } else { None });
        Self {
            width: width.map(|w| w.max(MIN_WIDTH)),
            colour: tty && !super::no_color(),
        }
    }
}

/// Folds text onto one line (line breaks and runs of white space become one space), so that a
/// table cell stays one line; nothing is cut.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cuts text to `max` terminal columns (on a character boundary), marking the cut with `…`, and
/// folds line breaks so that a cell stays one line.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    use unicode_width::UnicodeWidthChar;

    let one_line = one_line(text);
    if one_line.width() <= max {
        return one_line;
    }
    let mut cut = String::new();
    let mut used = 0;
    for c in one_line.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > max.saturating_sub(1) {
            break;
        }
        used += w;
        cut.push(c);
    }
    cut.push('…');
    cut
}

/// One step of a table's plan for a narrow width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Show the column's compact cells instead of its full ones.
    Compact(usize),
    /// Leave the column out.
    Drop(usize),
}

struct Column {
    header: &'static str,
    cells: Vec<String>,
    compact: Option<Vec<String>>,
    colours: Vec<Option<Color>>,
    /// The narrowest it may be cut to, if its text may be cut.
    flex: Option<usize>,
    /// Never cut (the saga id).
    whole: bool,
    right: bool,
    use_compact: bool,
    shown: bool,
}

impl Column {
    fn texts(&self) -> &[String] {
        match (&self.compact, self.use_compact) {
            (Some(c), true) => c,
            _ => &self.cells,
        }
    }

    /// The width it takes in full.
    fn natural(&self) -> usize {
        self.texts()
            .iter()
            .map(|t| t.width())
            .chain([self.header.width()])
            .max()
            .unwrap_or(0)
    }

    /// The width it takes at its narrowest.
    fn least(&self) -> usize {
        let natural = self.natural();
        match self.flex {
            Some(min) => natural.min(min.max(self.header.width())),
            None => natural,
        }
    }
}

/// A table under construction, by columns.
pub(crate) struct Grid {
    columns: Vec<Column>,
}

/// Borders and padding around each column (`│ x ┆`), and the closing border.
const PER_COLUMN: usize = 3;

impl Grid {
    pub(crate) fn new() -> Self {
        Self {
            columns: Vec::new(),
        }
    }

    /// Adds a column; returns its index for [`Fit`] steps and the setters below.
    pub(crate) fn column(&mut self, header: &'static str, cells: Vec<String>) -> usize {
        let n = cells.len();
        self.columns.push(Column {
            header,
            cells,
            compact: None,
            colours: vec![None; n],
            flex: None,
            whole: false,
            right: false,
            use_compact: false,
            shown: true,
        });
        self.columns.len() - 1
    }

    /// Its text may be cut, down to `min` columns.
    pub(crate) fn flex(&mut self, i: usize, min: usize) -> &mut Self {
        self.columns[i].flex = Some(min);
        self
    }

    /// It is never cut.
    pub(crate) fn whole(&mut self, i: usize) -> &mut Self {
        self.columns[i].whole = true;
        self
    }

    /// Right-aligned (numbers).
    pub(crate) fn right(&mut self, i: usize) -> &mut Self {
        self.columns[i].right = true;
        self
    }

    /// Shorter cells to show when the full ones do not fit.
    pub(crate) fn compact(&mut self, i: usize, cells: Vec<String>) -> &mut Self {
        self.columns[i].compact = Some(cells);
        self
    }

    /// Shows its compact cells whatever the width (when it has them).
    pub(crate) fn use_compact(&mut self, i: usize) -> &mut Self {
        self.columns[i].use_compact = self.columns[i].compact.is_some();
        self
    }

    /// Colours of its cells, on a terminal that takes them.
    pub(crate) fn colours(&mut self, i: usize, colours: Vec<Option<Color>>) -> &mut Self {
        self.columns[i].colours = colours;
        self
    }

    /// Left out when no cell has anything in it.
    pub(crate) fn hide_if_empty(&mut self, i: usize) -> &mut Self {
        let c = &mut self.columns[i];
        if c.cells.iter().all(|t| t.trim().is_empty()) {
            c.shown = false;
        }
        self
    }

    fn least_total(&self) -> usize {
        self.columns
            .iter()
            .filter(|c| c.shown)
            .map(|c| c.least() + PER_COLUMN)
            .sum::<usize>()
            + 1
    }

    /// Shares the room the other columns leave among the cuttable ones (the narrowest needs
    /// first, each at most its natural width, and at least its minimum while there is room for
    /// every minimum) and cuts their cells to it, character by character: comfy-table would
    /// break at a space and keep only the first word. Returns whether the table now fits.
    fn cut_flexible_to(&mut self, width: usize) -> bool {
        let fixed: usize = self
            .columns
            .iter()
            .filter(|c| c.shown && c.flex.is_none())
            .map(|c| c.natural() + PER_COLUMN)
            .sum::<usize>()
            + 1;
        let mut flexible: Vec<usize> = (0..self.columns.len())
            .filter(|&i| self.columns[i].shown && self.columns[i].flex.is_some())
            .collect();
        flexible.sort_by_key(|&i| self.columns[i].natural());
        let Some(mut room) = width.checked_sub(fixed + PER_COLUMN * flexible.len()) else {
            return false;
        };
        if room < flexible.len() {
            return false;
        }
        let minimums: usize = flexible.iter().map(|&i| self.columns[i].least()).sum();
        let mut left = flexible.len();
        for i in flexible {
            let c = &mut self.columns[i];
            let even = room / left.max(1);
            let share = if room >= minimums {
                even.max(c.least())
            } else {
                even
            };
            let w = c.natural().min(share).max(1);
            room = room.saturating_sub(w);
            left -= 1;
            let cut = |t: &String| truncate(t, w);
            c.cells = c.cells.iter().map(cut).collect();
            c.compact = c.compact.as_ref().map(|v| v.iter().map(cut).collect());
        }
        true
    }

    /// The table for `layout`: the plan applied as far as the width needs, cells cut to one
    /// line, statuses coloured if the layout says so.
    pub(crate) fn render(mut self, layout: &Layout, plan: &[Fit]) -> Table {
        let width = layout.width.map(usize::from);
        if let Some(width) = width {
            for step in plan {
                if self.least_total() <= width {
                    break;
                }
                match *step {
                    Fit::Compact(i) => self.columns[i].use_compact = true,
                    Fit::Drop(i) => self.columns[i].shown = false,
                }
            }
        }
        let fits = match width {
            Some(width) => self.cut_flexible_to(width),
            None => true,
        };
        let shown: Vec<&Column> = self.columns.iter().filter(|c| c.shown).collect();

        let mut t = Table::new();
        t.load_preset(presets::UTF8_FULL_CONDENSED)
            .set_truncation_indicator("…")
            // Width and colour are decided here, from the layout, not by looking at stdout.
            .force_no_tty();
        if layout.colour {
            t.enforce_styling();
            // Colour the word, not the padding around it.
            t.style_text_only();
        }
        match width {
            Some(w) => {
                t.set_content_arrangement(ContentArrangement::Dynamic)
                    .set_width(u16::try_from(w).unwrap_or(u16::MAX));
            }
            None => {
                t.set_content_arrangement(ContentArrangement::Disabled);
            }
        }
        let mut header = Row::from(shown.iter().map(|c| c.header));
        if width.is_some() {
            header.max_height(1);
        }
        t.set_header(header);
        let rows = shown.first().map_or(0, |c| c.cells.len());
        for r in 0..rows {
            let mut row = Row::from(shown.iter().map(|c| {
                let mut cell = Cell::new(&c.texts()[r]);
                if let Some(colour) = c.colours.get(r).copied().flatten() {
                    cell = cell.fg(colour);
                }
                cell
            }));
            if width.is_some() {
                row.max_height(1);
            }
            t.add_row(row);
        }
        for (i, c) in shown.iter().enumerate() {
            if let Some(col) = t.column_mut(i) {
                if c.right {
                    col.set_cell_alignment(CellAlignment::Right);
                }
                // Uncuttable columns keep their width; if even the plan could not make the
                // table fit, only the whole ones do and comfy-table cuts the rest.
                if width.is_some() && c.flex.is_none() && (fits || c.whole) {
                    col.set_constraint(ColumnConstraint::ContentWidth);
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widest_line(t: &Table) -> usize {
        t.to_string().lines().map(|l| l.width()).max().unwrap_or(0)
    }

    fn sample() -> (Grid, usize, usize, usize) {
        let mut g = Grid::new();
        let id = g.column("id", vec!["0193a4f2-7c1e-7b3a-9d2e-5f6a7b8c9d0e".into(); 2]);
        let at = g.column("at", vec!["2026-11-30T10:00:00.000Z".into(); 2]);
        let err = g.column(
            "error",
            vec![
                "a very long error message that goes on and on about what went wrong".into(),
                String::new(),
            ],
        );
        g.whole(id)
            .flex(err, 10)
            .compact(at, vec!["10:00:00.000".into(); 2]);
        (g, id, at, err)
    }

    #[test]
    fn truncates_on_character_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("äöüäöüäöü", 4), "äöü…");
        assert_eq!(truncate("two\nlines", 20), "two lines");
        assert_eq!(
            truncate("漢字漢字", 5),
            "漢字…",
            "wide characters count twice"
        );
    }

    #[test]
    fn without_a_width_everything_is_whole() {
        let (g, ..) = sample();
        let t = g.render(&Layout::plain(), &[]);
        let text = t.to_string();
        assert!(
            text.contains("goes on and on about what went wrong"),
            "{text}"
        );
        assert!(text.contains("2026-11-30T10:00:00.000Z"));
    }

    #[test]
    fn a_width_is_kept_by_compacting_dropping_and_cutting() {
        for width in [100u16, 70, 60, 50, 45] {
            let (g, _, at, _) = sample();
            let layout = Layout {
                width: Some(width),
                colour: false,
            };
            let t = g.render(&layout, &[Fit::Compact(at), Fit::Drop(at)]);
            let text = t.to_string();
            assert!(widest_line(&t) <= usize::from(width), "{width}:\n{text}");
            assert!(
                text.contains("0193a4f2-7c1e-7b3a-9d2e-5f6a7b8c9d0e"),
                "{width}:\n{text}"
            );
            assert_eq!(text.lines().count(), 6, "one line per row:\n{text}");
        }
    }

    #[test]
    fn colour_only_when_asked() {
        let mut g = Grid::new();
        let s = g.column("status", vec!["FAILED".into()]);
        g.colours(s, vec![Some(Color::Red)]);
        let plain = g.render(&Layout::plain(), &[]).to_string();
        assert!(!plain.contains('\u{1b}'), "{plain}");
        let mut g = Grid::new();
        let s = g.column("status", vec!["FAILED".into()]);
        g.colours(s, vec![Some(Color::Red)]);
        let coloured = g
            .render(
                &Layout {
                    width: Some(80),
                    colour: true,
                },
                &[],
            )
            .to_string();
        assert!(coloured.contains('\u{1b}'), "{coloured}");
    }
}
