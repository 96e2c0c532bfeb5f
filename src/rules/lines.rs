//! Where a rule file's values are: the line numbers its errors name.

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
