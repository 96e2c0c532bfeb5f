//! The command as a template: `gpudoc fit` puts each value it tries where the command says `{}`;
//! `gpudoc run --try '{}=N'` changes a parameter the command marks with its value as is, `{64}`. Only the
//! braces and what is inside them are replaced: the rest of each argument is kept byte for byte.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// `{}`: where `gpudoc fit` puts the value.
fn empty(inside: &[u8]) -> bool {
    inside.is_empty()
}

/// `{64}`: a parameter at its value as is (what [`super::remedy::size_argument`] marks).
pub(crate) fn number(inside: &[u8]) -> bool {
    !inside.is_empty() && inside.iter().all(u8::is_ascii_digit)
}

/// The command with every `{…}` whose inside `kind` accepts replaced by `value`, and those insides, in
/// order.
fn fill(
    template: &[OsString],
    kind: fn(&[u8]) -> bool,
    value: u64,
) -> (Vec<OsString>, Vec<String>) {
    let v = value.to_string();
    let mut found = Vec::new();
    let out = template
        .iter()
        .map(|a| {
            let bytes = a.as_bytes();
            let mut out = Vec::with_capacity(bytes.len());
            let mut i = 0;
            while i < bytes.len() {
                let inside = (bytes[i] == b'{')
                    .then(|| bytes[i + 1..].iter().position(|&b| b == b'}'))
                    .flatten()
                    .map(|len| &bytes[i + 1..i + 1 + len])
                    .filter(|inside| kind(inside));
                match inside {
                    Some(inside) => {
                        out.extend_from_slice(v.as_bytes());
                        found.push(String::from_utf8_lossy(inside).into_owned());
                        i += inside.len() + 2;
                    }
                    None => {
                        out.push(bytes[i]);
                        i += 1;
                    }
                }
            }
            OsString::from_vec(out)
        })
        .collect();
    (out, found)
}

/// The command with every `{}` replaced by `value`; `None` when no argument holds one.
pub fn command_for(template: &[OsString], value: u64) -> Option<Vec<OsString>> {
    let (out, found) = fill(template, empty, value);
    (!found.is_empty()).then_some(out)
}

/// The value as is of the parameter a command marks for `--try '{}=N'` (`--batch-size {64}`): every
/// mark must say the same value.
pub fn value_as_is(template: &[OsString]) -> Result<u64, String> {
    let (_, marks) = fill(template, number, 0);
    let Some(first) = marks.first() else {
        let has_empty = !fill(template, empty, 0).1.is_empty();
        return Err(if has_empty {
            "`{}` says where the value goes but not the value the command runs with as is: write it \
             inside the braces (`--batch-size {64}`)"
                .into()
        } else {
            "no parameter marked in the command: write its value as is in braces (`--batch-size {64}`)"
                .into()
        });
    };
    if let Some(other) = marks.iter().find(|m| *m != first) {
        return Err(format!(
            "`{{{first}}}` and `{{{other}}}`: the marks are one parameter, with one value as is"
        ));
    }
    first
        .parse()
        .map_err(|_| format!("`{{{first}}}`: too large a number"))
}

/// The command a `--try '{}=N'` marks, with its parameter at `value`.
pub fn command_at(template: &[OsString], value: u64) -> Vec<OsString> {
    fill(template, number, value).0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn every_placeholder_takes_the_value_and_nothing_else_changes() {
        let t = os(&[
            "python",
            "train.py",
            "--batch-size",
            "{}",
            "--tag=b{}x{}",
            "{x}",
            "{{}}",
        ]);
        assert_eq!(
            command_for(&t, 96).unwrap(),
            os(&[
                "python",
                "train.py",
                "--batch-size",
                "96",
                "--tag=b96x96",
                "{x}",
                "{96}"
            ])
        );
        assert_eq!(command_for(&os(&["python", "train.py"]), 1), None);
    }

    #[test]
    fn a_non_utf8_argument_keeps_its_bytes() {
        let t = vec![OsString::from_vec(b"\xff{}\xfe{".to_vec())];
        assert_eq!(
            command_for(&t, 7).unwrap(),
            vec![OsString::from_vec(b"\xff7\xfe{".to_vec())]
        );
    }

    #[test]
    fn a_marked_parameter_runs_at_its_value_as_is_or_at_the_one_tried() {
        let t = os(&[
            "train.py",
            "--batch-size",
            "{64}",
            "--tag=b{64}",
            "{}",
            "{x}",
        ]);
        assert_eq!(value_as_is(&t), Ok(64));
        assert_eq!(
            command_at(&t, 48),
            os(&["train.py", "--batch-size", "48", "--tag=b48", "{}", "{x}"])
        );
    }

    #[test]
    fn marks_that_are_missing_or_disagree_are_refused_with_the_form_to_use() {
        let bare = value_as_is(&os(&["train.py", "--batch-size", "{}"])).unwrap_err();
        assert!(bare.contains("`--batch-size {64}`"), "{bare}");
        let none = value_as_is(&os(&["train.py", "--batch-size", "64"])).unwrap_err();
        assert!(none.starts_with("no parameter marked"), "{none}");
        let two = value_as_is(&os(&["--batch-size", "{64}", "--seq", "{128}"])).unwrap_err();
        assert!(two.contains("`{64}` and `{128}`"), "{two}");
        assert!(value_as_is(&os(&["{99999999999999999999999}"])).is_err());
    }
}
