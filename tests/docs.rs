//! The reference tables in the documentation are generated from the code: each lies between
//! `<!-- NAME:begin -->` and `<!-- NAME:end -->` and must equal what the code says now.
//! `GPUDOC_BLESS=1 cargo test --test docs` rewrites them.

use gpudoc::rules::{RuleSet, facts};
use std::path::Path;

/// Checks (or, with GPUDOC_BLESS, rewrites) the section `name` of `file`.
fn section(file: &str, name: &str, want: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = (
        format!("<!-- {name}:begin -->\n"),
        format!("<!-- {name}:end -->"),
    );
    let a = text
        .find(&begin)
        .unwrap_or_else(|| panic!("{file} has no {begin}"))
        + begin.len();
    let b = text
        .find(&end)
        .unwrap_or_else(|| panic!("{file} has no {end}"));
    if std::env::var_os("GPUDOC_BLESS").is_some() {
        std::fs::write(&path, format!("{}{want}{}", &text[..a], &text[b..])).unwrap();
    } else {
        assert!(
            text[a..b] == *want,
            "{file}: the {name} table is stale: run GPUDOC_BLESS=1 cargo test --test docs"
        );
    }
}

fn table(head: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut t = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        t.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    t
}

#[test]
fn facts_table() {
    let rows = facts::DOC
        .iter()
        .map(|(n, ty, what)| vec![format!("`{n}`"), ty.to_string(), what.to_string()]);
    section(
        "README.md",
        "facts",
        &table(&["fact", "type", "meaning"], rows),
    );
}

#[test]
fn rules_table() {
    let set = RuleSet::load(None, &[]).unwrap();
    let rows = set.rules.iter().map(|r| {
        vec![
            format!("`{}`", r.id),
            r.severity.name().to_string(),
            r.scope.name().to_string(),
            r.title.clone(),
        ]
    });
    section(
        "README.md",
        "rules",
        &table(&["rule", "severity", "for each", "finds"], rows),
    );
}

#[test]
fn every_metric_is_documented() {
    use gpudoc::metrics::{Format, GpuView, TorchView, View, render};
    let v = View {
        gpus: vec![GpuView {
            job: Some(1),
            ..Default::default()
        }],
        torch: vec![TorchView {
            step_peak_allocated: Some(1),
            step_peak_reserved: Some(1),
            ..Default::default()
        }],
        oom_reports: Some(0),
        ..Default::default()
    };
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    let text = render(&v, Format::Prometheus);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert!(names.len() >= 16, "{names:?}");
    for n in names {
        assert!(
            doc.contains(&format!("`{n}`")),
            "docs/metrics.md does not document {n}"
        );
    }
}
