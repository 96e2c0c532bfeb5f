//! Bytes are `u64` bytes everywhere inside gpudoc; human units appear only here, when printing. Text from
//! other processes (command lines, names) is made printable here too.

use std::borrow::Cow;

const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// `1536` → `1.50 KiB`; two decimals, as PyTorch prints sizes.
pub fn fmt_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// `part` as a percentage of `whole`, one decimal.
pub fn fmt_pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// Seconds, short: `0.42 s`, `12.3 s`, `1h02m`.
pub fn fmt_secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 600.0 {
        format!("{s:.1} s")
    } else {
        let m = (s / 60.0).floor() as u64;
        if m < 60 {
            format!("{m}m{:02.0}s", s - m as f64 * 60.0)
        } else {
            format!("{}h{:02}m", m / 60, m % 60)
        }
    }
}

/// A path as a user reads it in a diagnosis: its last two components (`/home/u/train.py` → `u/train.py`).
pub fn path_tail(path: &str) -> String {
    let parts: Vec<&str> = path.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// The MiB figure `nvidia-smi` prints (floor of bytes / 2^20).
pub fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A sparkline of `values` scaled to `max` (the series' own maximum when `max` is 0).
pub fn sparkline(values: &[u64], max: u64) -> String {
    let max = if max == 0 {
        values.iter().copied().max().unwrap_or(0)
    } else {
        max
    };
    values
        .iter()
        .map(|&v| {
            if max == 0 {
                BARS[0]
            } else {
                let i = ((v as f64 / max as f64) * (BARS.len() - 1) as f64).round() as usize;
                BARS[i.min(BARS.len() - 1)]
            }
        })
        .collect()
}

/// Parses a size with its unit: `40GiB`, `512 MiB`, `1.5GB` (decimal units too), `100B`; `0` alone. A
/// number without a unit is refused: `40` could mean bytes or gigabytes, and a gate must not guess.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (write it like 40GiB or 512MiB)"))?;
    let mult: f64 = match unit.trim() {
        "" if n == 0.0 => 1.0,
        "" => {
            return Err(format!(
                "`{s}` has no unit: write {num}GiB, {num}MiB or {num}B"
            ));
        }
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        u => {
            // Units are case-sensitive (MB is 10^6, MiB 2^20): a unit in the wrong case is named.
            const UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"];
            let hint = UNITS
                .iter()
                .find(|k| k.eq_ignore_ascii_case(u))
                .map(|k| format!(": did you mean {num}{k}?"))
                .unwrap_or_default();
            return Err(format!(
                "`{s}`: unknown unit `{u}` (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB){hint}"
            ));
        }
    };
    let v = n * mult;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(v.round() as u64)
}

/// `s` with every control character escaped (`\x1b`, `\n`, `\u{9b}`), so text from another process (a
/// command line named `$'\e]0;PWNED\a'`) can never move the cursor, retitle or clear the terminal it is
/// printed on.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`printable`], cut to `max` characters with `…`.
pub fn shorten(s: &str, max: usize) -> String {
    let p = printable(s);
    if p.chars().count() <= max {
        p.into_owned()
    } else {
        let mut t: String = p.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_in_the_wrong_case_is_named() {
        assert_eq!(
            parse_bytes("2gib"),
            Err("`2gib`: unknown unit `gib` (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB): did you mean 2GiB?".into())
        );
        assert!(
            parse_bytes("2mb")
                .unwrap_err()
                .ends_with("did you mean 2MB?")
        );
        assert!(!parse_bytes("2xb").unwrap_err().contains("did you mean"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("40GiB"), Ok(40 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("123B"), Ok(123));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(
            parse_bytes("40")
                .unwrap_err()
                .contains("no unit: write 40GiB")
        );
        assert!(parse_bytes("99999999999999999999TiB").is_err());
        assert!(parse_bytes("40 gigs").is_err());
        assert!(parse_bytes("lots").is_err());
    }

    #[test]
    fn bytes_in_pytorch_style() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(60 << 30), "60.00 GiB");
        assert_eq!(fmt_bytes(143771 << 20), "140.40 GiB");
    }

    #[test]
    fn sparkline_scales_to_max() {
        assert_eq!(sparkline(&[0, 50, 100], 100), "▁▅█");
        assert_eq!(sparkline(&[0, 0], 0), "▁▁");
        assert_eq!(sparkline(&[10, 20], 0), "▅█");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("python3 train.py"), "python3 train.py");
        assert_eq!(
            printable("\u{1b}]0;PWNED\u{7}\u{1b}[2J"),
            "\\x1b]0;PWNED\\x07\\x1b[2J"
        );
        assert_eq!(printable("a\nb\u{9b}c"), "a\\nb\\u{9b}c");
        assert_eq!(shorten("\u{1b}[2Jabcdef", 8), "\\x1b[2J…");
        assert_eq!(shorten("héllo wörld", 20), "héllo wörld");
    }

    #[test]
    fn seconds() {
        assert_eq!(fmt_secs(0.421), "0.42 s");
        assert_eq!(fmt_secs(75.0), "75.0 s");
        assert_eq!(fmt_secs(3725.0), "1h02m");
    }
}
