//! The reference tables in the documentation are generated from the code: each lies between
//! `<!-- NAME:begin -->` and `<!-- NAME:end -->` and must equal what the code says now.
//! `GPUDOC_BLESS=1 cargo test --test docs` rewrites them.

mod common;

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
    let rows = facts::documented()
        .into_iter()
        .map(|(n, ty, what)| vec![format!("`{n}`"), ty.to_string(), what.to_string()]);
    section(
        "docs/rules.md",
        "facts",
        &table(&["fact", "type", "meaning"], rows),
    );
}

#[test]
fn hunt_records_table() {
    let rows = facts::records()
        .into_iter()
        .map(|(n, ty, what)| vec![format!("`{n}`"), ty.to_string(), what.to_string()]);
    section(
        "docs/rules.md",
        "records",
        &table(&["field", "type", "meaning"], rows),
    );
}

#[test]
fn params_table() {
    use gpudoc::params::{ALL, Number, Unit};
    let value = |p: &gpudoc::params::Param| match (p.unit, p.value) {
        (Unit::Bytes, Number::Int(b)) => format!("{b} ({})", gpudoc::units::fmt_bytes(b as u64)),
        (_, n) => n.to_string(),
    };
    let rows = ALL.iter().map(|p| {
        vec![
            format!("`param.{}`", p.name),
            value(p),
            p.unit.name().to_string(),
            p.decides.to_string(),
        ]
    });
    section(
        "docs/rules.md",
        "params",
        &table(&["parameter", "value", "unit", "decides"], rows),
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
            r.also().join(", "),
            r.title.clone(),
        ]
    });
    section(
        "docs/rules.md",
        "rules",
        &table(
            &["rule", "severity", "for each", "also judged", "finds"],
            rows,
        ),
    );
}

#[test]
fn oom_formats_table() {
    use gpudoc::oom::formats::FORMATS;
    let code = |s: &str| format!("`{}`", s.replace('|', "\\|"));
    let rows = FORMATS.iter().map(|f| {
        let kind = serde_json::to_value(f.kind).unwrap();
        let vendor = f
            .vendor
            .map_or("any (nvidia unless its words say)".into(), |v| {
                serde_json::to_value(v)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string()
            });
        let fields: Vec<String> = f.fields().iter().map(|x| code(x.name())).collect();
        let needles: Vec<String> = f.needles.iter().map(|n| code(n)).collect();
        vec![
            code(f.id),
            code(f.format),
            code(kind.as_str().unwrap()),
            format!("{} (`{}`)", f.source.label(), f.source.id()),
            vendor,
            f.means.words().to_string(),
            if fields.is_empty() {
                "none".into()
            } else {
                fields.join(", ")
            },
            needles.join(", "),
        ]
    });
    section(
        "docs/oom.md",
        "formats",
        &table(
            &[
                "row",
                "format",
                "source",
                "written by",
                "vendor",
                "means",
                "figures",
                "words looked for",
            ],
            rows,
        ),
    );
    programs_table();
}

/// docs/oom.md's list of programs: written by `oom_formats_table`, the one test that writes docs/oom.md
/// (two tests blessing one file at once would lose one's section).
fn programs_table() {
    use gpudoc::program::ALL;
    let rows = ALL.iter().map(|p| {
        let aliases: Vec<String> = p.aliases().iter().map(|a| format!("`{a}`")).collect();
        vec![
            format!("`{}`", p.id()),
            p.label().to_string(),
            aliases.join(", "),
        ]
    });
    section(
        "docs/oom.md",
        "programs",
        &table(&["id", "named", "also known as"], rows),
    );
}

#[test]
fn every_metric_is_documented() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    for m in gpudoc::metrics::ALL {
        assert!(
            doc.contains(&format!("| `{}` | {} |", m.name, m.kind)),
            "docs/metrics.md does not document {} as a {}",
            m.name,
            m.kind
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
    section("docs/fit.md", "fit-flags", &flags("fit"));
}

/// The text of the first fenced block after `marker` in `file`.
fn block_after(file: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("{file}: no {marker}"));
    let open = at + text[at..].find("```").unwrap();
    let body = open + text[open..].find('\n').unwrap() + 1;
    let close = body + text[body..].find("```").unwrap();
    text[body..close].to_string()
}

#[test]
fn the_readmes_example_is_the_fixtures_output_with_every_cut_marked() {
    let shown = block_after(
        "README.md",
        "An evaluation after training that kept its outputs",
    );
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/phases/eval_oom.report.json"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpudoc"))
        .args(["report", fixture, "--color", "never"])
        .output()
        .unwrap();
    let real = String::from_utf8(out.stdout).unwrap();
    let mut real = real.lines().peekable();
    let mut cut = false;
    for line in shown.lines() {
        if line.trim() == "…" {
            cut = true;
            continue;
        }
        // Lines the README leaves out are only where a `…` says so.
        while cut && real.peek().is_some_and(|r| *r != line) {
            real.next();
        }
        assert_eq!(
            real.next(),
            Some(line),
            "README.md's example differs, or a cut is not marked"
        );
        cut = false;
    }
    assert!(
        cut || real.next().is_none(),
        "README.md's example ends early without a `…`"
    );
}

#[test]
fn trying_gpudoc_without_a_gpu_works_as_development_md_says() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("gpus.json");
    let script = block_after("docs/development.md", "## Trying gpudoc without a GPU")
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("/tmp/gpus.json", &state.display().to_string())
        // `cargo test --workspace` builds the fake library where tests find it (target/debug/deps),
        // not where `cargo build --workspace` puts it.
        .replace(
            "$PWD/target/debug/libfake_nvml.so",
            &common::fake_lib().display().to_string(),
        );
    let out = std::process::Command::new("bash")
        .args(["-c", &format!("exec 2>&1\n{script}")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "fakegpu alloc --steps 1GiB,3GiB,2GiB --hold-ms 300 exited with code 0",
        "job peak 3.00 GiB",
        "gpudoc gate: FAILED: GPU 0: peak 3.00 GiB over budget 2.00 GiB\n122",
        "[step-leak]",
        "ghost",
    ] {
        assert!(all.contains(want), "{want}: {all}");
    }
}

#[test]
fn the_readme_gives_the_sampling_rates_gpudoc_uses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let r = gpudoc::sample::Rates::default();
    let hz = |d: std::time::Duration| (1.0 / d.as_secs_f64()).round() as u64;
    let want = format!(
        "each GPU's memory at {} kHz, its processes at {} Hz",
        hz(r.device) / 1000,
        hz(r.process)
    );
    assert!(text.contains(&want), "README.md should say: {want}");
}

#[test]
fn run_md_lists_every_exit_code_and_variable() {
    let codes = gpudoc::exit::TABLE
        .iter()
        .filter(|(cmd, _, _)| *cmd == "run")
        .map(|(_, code, what)| vec![code.to_string(), what.to_string()]);
    section(
        "docs/run.md",
        "exit-codes",
        &table(&["code", "meaning"], codes),
    );
    let vars = gpudoc::settings::VARIABLES
        .iter()
        .map(|(v, what)| vec![format!("`{v}`"), what.to_string()]);
    section(
        "docs/run.md",
        "environment",
        &table(&["variable", "meaning"], vars),
    );
}
