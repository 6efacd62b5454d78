//! Progress bars on a terminal, silence elsewhere.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-counting bar when stderr is a terminal; hidden otherwise.
#[must_use]
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// A bar counting positions out of a total (set as it becomes known) when stderr is a
/// terminal; hidden otherwise.
#[must_use]
pub fn count_bar(what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    // Length 1 until the total is known: a length of 0 shows as 100%.
    let bar = ProgressBar::new(1);
    let style = ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent}% eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}
