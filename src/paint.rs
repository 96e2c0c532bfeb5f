//! Colours for human output, on or off as decided once from `--color`, the environment and the terminal
//! (see `settings`). Text that comes from other processes is made printable here too, so a command line
//! can never rewrite the terminal of whoever reads gpudoc's output.

use owo_colors::OwoColorize;

/// Colours on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Paint(pub bool);

impl Paint {
    pub fn bold(&self, s: &str) -> String {
        self.style(s, |s| s.bold().to_string())
    }
    pub fn good(&self, s: &str) -> String {
        self.style(s, |s| s.green().to_string())
    }
    /// Red and bold: failures, leftovers.
    pub fn bad(&self, s: &str) -> String {
        self.style(s, |s| s.red().bold().to_string())
    }
    pub fn warn(&self, s: &str) -> String {
        self.style(s, |s| s.yellow().to_string())
    }
    pub fn dim(&self, s: &str) -> String {
        self.style(s, |s| s.dimmed().to_string())
    }

    fn style(&self, s: &str, f: impl Fn(&str) -> String) -> String {
        if self.0 { f(s) } else { s.to_string() }
    }
}
