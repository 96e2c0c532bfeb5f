//! The house's layers: modules depend one way (main → commands → settings → domain → leaves). Read from
//! the `crate::` paths in src/, the module graph must have no cycle; a new one fails here with its path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            if top == "main" || top == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let deps = g.entry(top.clone()).or_default();
            for part in text.split("crate::").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != top {
                    deps.insert(name);
                }
            }
            // `use crate::{a, b}` names several at once.
            for part in text.split("crate::{").skip(1) {
                let inner = part.split('}').next().unwrap_or("");
                for name in inner.split(',') {
                    let name: String = name
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != top {
                        deps.insert(name);
                    }
                }
            }
        }
    }
    g
}

/// A cycle through `start`, if there is one.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        g: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in g.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(g, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(g, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn modules_form_no_cycle() {
    let g = graph();
    assert!(g.len() > 10, "the source was read: {g:?}");
    let cycles: Vec<String> = g
        .keys()
        .filter_map(|m| cycle(&g, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn domain_modules_never_import_clap_structs_or_commands() {
    let g = graph();
    for (m, deps) in &g {
        if ["commands", "settings", "cli"].contains(&m.as_str()) {
            continue;
        }
        for bad in ["cli", "commands", "settings"] {
            assert!(!deps.contains(bad), "{m} imports {bad}");
        }
    }
}
