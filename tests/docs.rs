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
        "docs/rules.md",
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
        "docs/rules.md",
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

/// A subcommand's flags, from clap: flag and value, default, help.
fn flags(sub: &str) -> String {
    use clap::CommandFactory;
    let mut cmd = gpudoc::cli::Cli::command();
    cmd.build();
    let c = cmd.find_subcommand(sub).unwrap();
    let rows = c
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_long().is_some())
        .filter(|a| !["help", "version"].contains(&a.get_id().as_str()))
        .map(|a| {
            let long = a.get_long().unwrap();
            let mut flag = match a.get_short() {
                Some(s) => format!("`-{s}`, `--{long}"),
                None => format!("`--{long}"),
            };
            let takes = a.get_num_args().is_some_and(|n| n.takes_values());
            if takes && let Some(v) = a.get_value_names().and_then(|v| v.first()) {
                if a.get_num_args().is_some_and(|n| n.min_values() == 0) {
                    flag.push_str(&format!("[={v}]"));
                } else {
                    flag.push_str(&format!(" {v}"));
                }
            }
            flag.push('`');
            let flag = flag.replace('|', "\\|");
            let default: Vec<String> = a
                .get_default_values()
                .iter()
                .filter(|_| takes)
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect();
            let mut help = a
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default()
                .replace('|', "\\|")
                .replace('\n', " ");
            let values: Vec<String> = a
                .get_possible_values()
                .iter()
                .filter(|p| !p.is_hide_set())
                .map(|p| format!("`{}`", p.get_name()))
                .collect();
            if !values.is_empty() && takes {
                help.push_str(&format!(" ({})", values.join(", ")));
            }
            vec![flag, default.join(", "), help]
        });
    table(&["flag", "default", "meaning"], rows)
}

#[test]
fn flags_tables() {
    section("docs/run.md", "run-flags", &flags("run"));
    section("docs/reference.md", "report-flags", &flags("report"));
    section("docs/reference.md", "compare-flags", &flags("compare"));
    section("docs/orphans.md", "orphans-flags", &flags("orphans"));
    section("docs/watch.md", "watch-flags", &flags("watch"));
}
