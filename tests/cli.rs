//! What a user of rg, uv or nextest expects around the tool: quiet ends on a closed pipe, shell completions
//! and a man page made from the same definitions as `--help`.

mod common;

use clap::CommandFactory;
use common::gpudoc_bin;
use std::process::Command;

fn sh(script: &str) -> std::process::Output {
    Command::new("bash")
        .args(["-c", script])
        .env("GPUDOC", gpudoc_bin())
        .output()
        .unwrap()
}

#[test]
fn every_subcommand_ends_quietly_when_its_reader_goes_away() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/runs/leak.report.json"
    );
    for args in [
        "rules list",
        "rules facts",
        "rules explain step-leak",
        &format!("report {fixture}"),
        &format!("report {fixture} --json -"),
        &format!("compare {fixture} {fixture}"),
        "completions bash",
        "man",
        "--help",
        "run --help",
    ] {
        // `head -c 1` reads one byte and leaves: the rest is written into a closed pipe.
        let out = sh(&format!(
            "set -o pipefail; \"$GPUDOC\" {args} | head -c 1 >/dev/null; echo \"status ${{PIPESTATUS[0]}}\" >&2"
        ));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args}: {err}"
        );
        let status: i32 = err.trim().rsplit(' ').next().unwrap().parse().unwrap();
        assert!(status == 0 || status == 141, "{args}: exit {status}: {err}");
    }
}

#[test]
fn completions_know_every_subcommand_and_flag() {
    let cmd = gpudoc::cli::Cli::command();
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let out = Command::new(gpudoc_bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        for sub in cmd.get_subcommands() {
            assert!(text.contains(sub.get_name()), "{shell}: {}", sub.get_name());
        }
        assert!(
            text.contains("hunt-leaks") && text.contains("html"),
            "{shell}"
        );
    }
    // Sourced by bash, it completes `gpudoc r` to the subcommands that start with r.
    let out = sh(
        r#"source <("$GPUDOC" completions bash) && complete -p gpudoc &&
        COMP_WORDS=(gpudoc r) COMP_CWORD=1 COMP_LINE="gpudoc r" COMP_POINT=8 && _gpudoc gpudoc r gpudoc &&
        echo "${COMPREPLY[@]}""#,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("-F _gpudoc gpudoc"), "{text}");
    let last = text.lines().last().unwrap_or("");
    for sub in ["run", "report", "rules"] {
        assert!(last.split(' ').any(|w| w == sub), "{text}");
    }
    assert!(!last.split(' ').any(|w| w == "orphans"), "{text}");
    let out = Command::new(gpudoc_bin())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn the_man_page_has_every_subcommand_and_option() {
    let out = Command::new(gpudoc_bin()).arg("man").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH gpudoc 1"));
    // One page is installed: no pointer to a gpudoc-run(1) that does not exist.
    assert!(!page.contains("(1)"), "a reference to another page");
    assert!(
        page.contains("\\fBgpudoc run\\fR\n"),
        "the subcommands listed as sections"
    );
    let cmd = gpudoc::cli::Cli::command();
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let head = format!(".SH \"GPUDOC {}\"", sub.get_name().to_uppercase());
        assert!(page.contains(&head), "{head}");
        for arg in sub.get_arguments().filter_map(|a| a.get_long()) {
            // roff escapes the dashes.
            let flag = format!("\\-\\-{}", arg.replace('-', "\\-"));
            assert!(page.contains(&flag), "gpudoc {}: {flag}", sub.get_name());
        }
    }
    // It renders: man reads it without a warning, where man is installed.
    let man = sh(
        r#"command -v man >/dev/null || exit 0; "$GPUDOC" man | MANWIDTH=100 man -l - 2>&1 >/dev/null"#,
    );
    assert!(
        man.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&man.stdout)
    );
}

#[test]
fn the_man_page_says_the_exit_codes_and_the_environment() {
    let out = Command::new(gpudoc_bin()).arg("man").output().unwrap();
    let page = String::from_utf8(out.stdout).unwrap();
    let section = |name: &str| {
        let at = page
            .find(&format!(".SH \"{name}\"\n"))
            .unwrap_or_else(|| panic!("no {name} section"));
        let rest = &page[at + 5..];
        rest[..rest.find(".SH ").unwrap_or(rest.len())].to_string()
    };
    let codes = section("EXIT STATUS");
    for code in [
        "122 (run)",
        "125 (run)",
        "127 (run)",
        "1 (orphans)",
        "3 (fit)",
        "2 (others)",
    ] {
        assert!(codes.contains(code), "EXIT STATUS lacks {code}:\n{codes}");
    }
    let vars = section("ENVIRONMENT");
    for var in [
        "GPUDOC_NVML_LIB",
        "NO_COLOR",
        "CUDA_VISIBLE_DEVICES",
        "XDG_STATE_HOME",
    ] {
        assert!(
            vars.contains(&var.replace('-', "\\-")),
            "ENVIRONMENT lacks {var}"
        );
    }
}
