//! The files deploy/ ships for a fleet's Prometheus and Grafana: the alerting rules pass `promtool check
//! rules` and their own `promtool test rules`, the dashboard's queries parse (each wrapped in a recording
//! rule for `promtool check rules`: offline), and every query, alert and recorded test series names only
//! metrics gpudoc exports (`gpudoc::metrics::ALL`).

mod common;

use common::tool;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// `promtool ARGS...`, which must succeed: its output.
fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// PromQL's words that are not metric names: aggregations, which may be followed by `by (...)` before
/// their parenthesis, and the binary and modifier keywords.
const KEYWORDS: [&str; 22] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "start",
    "end",
];
/// The words followed by a list of label names in parentheses.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression reads: its identifiers outside strings, label matchers, ranges
/// and label lists, less functions (an identifier followed by a parenthesis) and keywords.
fn metric_names(expr: &str) -> Vec<String> {
    let c: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut labels_next = false;
    let mut i = 0;
    // The index just past the `close` that ends what opens at `i`, passing over quoted strings.
    let past = |mut i: usize, close: char| {
        let mut quote = None;
        i += 1;
        while i < c.len() {
            match (quote, c[i]) {
                (Some(_), '\\') => i += 1,
                (Some(q), x) if x == q => quote = None,
                (None, x @ ('"' | '\'' | '`')) => quote = Some(x),
                (None, x) if x == close => return i + 1,
                _ => {}
            }
            i += 1;
        }
        i
    };
    while i < c.len() {
        match c[i] {
            q @ ('"' | '\'' | '`') => {
                i += 1;
                while i < c.len() && c[i] != q {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' => i = past(i, '}'),
            '[' => i = past(i, ']'),
            '(' if labels_next => {
                i = past(i, ')');
                labels_next = false;
            }
            x if x.is_ascii_digit() || x == '.' => {
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
            }
            x if x.is_ascii_alphabetic() || x == '_' || x == ':' => {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_' || c[i] == ':') {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let next = c[i..].iter().find(|x| !x.is_whitespace());
                let lower = word.to_ascii_lowercase();
                if LABEL_LISTS.contains(&lower.as_str()) {
                    labels_next = next == Some(&'(');
                } else if !KEYWORDS.contains(&lower.as_str()) && next != Some(&'(') {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn metric_names_are_found_past_functions_matchers_and_label_lists() {
    let q = r#"'x' + max by (job_id) (max_over_time(gpudoc_job_memory_bytes{job_id!="a{b}"}[10m]) > 0)
        >= 1.5 * min without(gpu) (rate(x:y_total[5m] offset 1h)) and on (host) group_left(name) up or 2e3"#;
    assert_eq!(
        metric_names(q),
        ["gpudoc_job_memory_bytes", "x:y_total", "up"]
    );
}

/// Asserts that `names` are all metrics gpudoc exports, saying where each came from.
fn exported(names: &[String], whence: &str) {
    let all: Vec<&str> = gpudoc::metrics::ALL.iter().map(|m| m.name).collect();
    assert!(!names.is_empty(), "{whence}: no metric");
    for n in names {
        assert!(
            all.contains(&n.as_str()),
            "{whence} reads {n}, which gpudoc does not export (gpudoc::metrics::ALL: {all:?})"
        );
    }
}

/// The value of each `KEY: VALUE` of a YAML file, a block scalar (`KEY: |`) read to its end, unquoted.
fn yaml_values(text: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start().trim_start_matches("- ");
        let Some(value) = trimmed.strip_prefix(&format!("{key}:")) else {
            continue;
        };
        let value = value.trim();
        if value == "|" {
            let indent = |l: &str| l.len() - l.trim_start().len();
            let block: Vec<&str> = lines[n + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || indent(l) > indent(line))
                .map(|l| l.trim())
                .collect();
            out.push(block.join("\n"));
        } else {
            out.push(value.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    out
}

#[test]
fn the_alert_rules_pass_promtools_checks_and_their_tests() {
    let dir = deploy("prometheus");
    let checked = promtool(&["check", "rules", "gpudoc-alerts.yml"], &dir);
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "gpudoc-alerts.test.yml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let rules = std::fs::read_to_string(dir.join("gpudoc-alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("gpudoc-alerts.test.yml")).unwrap();
    // Every alert is tested, firing and not.
    for alert in yaml_values(&rules, "alert") {
        let said = format!("alertname: {alert}\n");
        let tested = tests.matches(&said).count();
        assert!(tested >= 2, "{alert} is tested {tested} times");
    }
    let exprs = yaml_values(&rules, "expr");
    assert_eq!(exprs.len(), 5);
    for e in &exprs {
        exported(&metric_names(e), &format!("the alert rule `{e}`"));
    }
    let series = yaml_values(&tests, "series");
    assert!(series.len() >= 10);
    for s in &series {
        exported(&metric_names(s), &format!("the test series `{s}`"));
    }
}

#[test]
fn rank_imbalance_alerts_at_the_thresholds_of_gpudocs_own_rule() {
    // The alert judges across nodes what the rule judges across one node's GPUs: the same thresholds.
    let rule = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/gpu-imbalance.toml"),
    )
    .unwrap();
    let rule = gpudoc::rules::Rule::parse(&rule, "gpu-imbalance.toml").unwrap();
    assert!(
        rule.when.contains("run.imbalance_ratio >= param.min_ratio")
            && rule
                .when
                .contains("run.job_peak_max_bytes - run.job_peak_min_bytes >= param.min_gap_bytes"),
        "{}",
        rule.when
    );
    use gpudoc::params::Number;
    let param = |name: &str| rule.own_params().iter().find(|p| p.0 == name).unwrap().1;
    assert_eq!(param("min_ratio"), Number::Float(1.5));
    assert_eq!(param("min_gap_bytes"), Number::Int(2 << 30));
    let alerts = std::fs::read_to_string(deploy("prometheus/gpudoc-alerts.yml")).unwrap();
    assert!(alerts.contains(">= 1.5 * min by (job_id)"));
    assert!(alerts.contains(">= 2 * 1024 ^ 3"));
}

/// Grafana's own variables, as a query would get them.
fn grafana_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
        .replace("$host", ".*")
        .replace("$job_id", ".*")
}

/// Every `expr` in the dashboard, with where it is.
fn dashboard_queries(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let here = match m.get("title") {
                    Some(Value::String(t)) => format!("{at} > {t}"),
                    _ => at.to_string(),
                };
                if k == "expr" {
                    out.push((here, x.as_str().unwrap().to_string()));
                } else {
                    dashboard_queries(x, &here, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| dashboard_queries(x, at, out)),
        _ => {}
    }
}

#[test]
fn the_dashboards_queries_parse_and_read_only_metrics_gpudoc_exports() {
    let text = std::fs::read_to_string(deploy("grafana/gpudoc.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    dashboard_queries(&dash["panels"], "panel", &mut queries);
    assert!(queries.len() >= 15, "{queries:?}");
    // Each query parses: wrapped in a recording rule, which `promtool check rules` parses offline.
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (at, q)) in queries.iter().enumerate() {
        let q = grafana_variables(q);
        exported(&metric_names(&q), at);
        rules += &format!(
            "      - record: dashboard:query{n}\n        expr: {}\n",
            serde_json::to_string(&q).unwrap()
        );
    }
    std::fs::write(dir.path().join("dashboard.yml"), &rules).unwrap();
    let checked = promtool(&["check", "rules", "dashboard.yml"], dir.path());
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
    // A variable's values come from a metric gpudoc exports.
    for var in dash["templating"]["list"].as_array().unwrap() {
        let Some(def) = var["definition"].as_str() else {
            continue;
        };
        let metric = def
            .strip_prefix("label_values(")
            .and_then(|d| d.split(',').next())
            .unwrap_or_else(|| panic!("variable {}: {def}", var["name"]));
        exported(
            &[metric.trim().to_string()],
            &format!("variable {}", var["name"]),
        );
    }
    // Every panel reads the dashboard's own Prometheus, and panels do not overlap in ids.
    let panels = dash["panels"].as_array().unwrap();
    let mut ids: Vec<i64> = panels.iter().map(|p| p["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len());
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
    }
}

#[test]
fn a_query_naming_a_metric_gpudoc_does_not_export_is_caught() {
    let names = metric_names("sum by (gpu) (DCGM_FI_DEV_FB_USED)");
    let caught = std::panic::catch_unwind(|| exported(&names, "a query"));
    assert!(caught.is_err());
}
