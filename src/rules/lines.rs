//! Where a rule file's values are: the line numbers its errors name; and a words file of a user's rules
//! folder read where it is there.

/// The line of `offset` in `doc`, counted from 1.
pub(super) fn line_of(doc: &str, offset: usize) -> usize {
    doc[..offset.min(doc.len())].matches('\n').count() + 1
}

/// The first line of a string value's text (a `'''` string starting with a newline begins one line on).
pub(super) fn value_line(doc: &str, span: std::ops::Range<usize>) -> usize {
    let raw = &doc[span.clone()];
    let skip =
        (raw.starts_with("'''") || raw.starts_with("\"\"\"")) && raw[3..].starts_with(['\n', '\r']);
    line_of(doc, span.start) + usize::from(skip)
}

/// The text of `rel` (`words/hunt.toml`) in a user's rules folder, and its path as errors name it; `None`
/// where the folder has none. A file there that cannot be read is an error naming it.
pub(super) fn read_in_dir(
    dir: &std::path::Path,
    rel: &str,
) -> Result<Option<(String, String)>, super::RuleError> {
    let path = dir.join(rel);
    let file = path.display().to_string();
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some((text, file))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(super::RuleError {
            file,
            line: 0,
            what: e.to_string(),
        }),
    }
}
