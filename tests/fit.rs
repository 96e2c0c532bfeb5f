//! `gpudoc fit`: the largest value of `{}` that runs without running out of GPU memory, from real runs of
//! a fake training loop (fixtures/fake_torch/batch.py: batch 80 fits the fake H200, 81 raises PyTorch's
//! OOM text) under gpudoc run's own machinery.

mod common;

use common::{Machine, conforms, fake_torch, read_json};

/// `gpudoc fit --json fit.json [extra] -- python3 batch.py --batch-size {}`: (exit code, result, stderr).
fn fit(m: &Machine, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let batch = fake_torch().join("batch.py");
    let batch = batch.to_str().unwrap();
    fit_of(m, extra, &["python3", batch, "--batch-size", "{}"])
}

/// `gpudoc fit --json fit.json [extra] -- command...` with the fake torch: (exit code, result, stderr).
fn fit_of(m: &Machine, extra: &[&str], command: &[&str]) -> (i32, serde_json::Value, String) {
    let json = m.path("fit.json");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(["fit", "--json"])
        .arg(&json)
        .args(extra)
        .arg("--")
        .args(command)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let result = if json.exists() {
        let r = read_json(&json);
        conforms("fit", &r);
        r
    } else {
        serde_json::Value::Null
    };
    (out.status.code().unwrap_or(-1), result, stderr)
}

fn runs(r: &serde_json::Value) -> Vec<(u64, String)> {
    r["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["value"].as_u64().unwrap(),
                p["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_program_that_runs_out_above_80_is_fitted_to_80_in_a_few_runs() {
    let m = Machine::h200s(1);
    let (code, r, stderr) = fit(&m, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(r["answer"], 80, "{stderr}");
    assert_eq!(r["verified"], true);
    assert_eq!(r["smallest_oom"], 81);
    let ran = runs(&r);
    assert!(ran.len() <= 10, "{ran:?}");
    assert!(ran.contains(&(80, "fits".into())), "{ran:?}");
    assert!(ran.contains(&(81, "oom".into())), "{ran:?}");
    // Measured, and within what the fake H200 leaves the job.
    let peak = r["measured_peak_bytes"].as_u64().unwrap();
    let limit = r["limit_bytes"].as_u64().unwrap();
    assert_eq!(limit, (143771 - 615) << 20);
    assert_eq!(peak, (500 + 16384 + 80 * 1568) << 20);
    assert_eq!(r["headroom_bytes"].as_u64().unwrap(), limit - peak);
    assert!(
        stderr.contains("80 is the largest value that fits (81 ran out of memory)"),
        "{stderr}"
    );
}

/// fixtures/fit: `gpudoc fit` on a real model on the H200 (tests/gpu/fit.sh), checked by bare runs.
#[test]
fn the_h200_fit_is_the_largest_batch_its_bare_runs_confirm() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fit");
    let r = read_json(&dir.join("fit.json"));
    conforms("fit", &r);
    let a = r["answer"].as_u64().unwrap();
    assert_eq!(r["smallest_oom"].as_u64(), Some(a + 1), "{r:#}");
    assert!(r["verified"].as_bool().unwrap());
    // Without gpudoc: ten steps at the answer, an OOM one above it.
    let bare = |v: u64| std::fs::read_to_string(dir.join(format!("bare_{v}.log"))).unwrap();
    assert_eq!(
        bare(a).lines().filter(|l| l.starts_with("step ")).count(),
        10
    );
    assert!(bare(a + 1).contains("torch.OutOfMemoryError: CUDA out of memory"));
    // The line the fit drew predicts the answer's measured peak within 1%.
    let (predicted, measured) = (
        r["predicted_peak_bytes"].as_f64().unwrap(),
        r["measured_peak_bytes"].as_f64().unwrap(),
    );
    assert!((predicted / measured - 1.0).abs() < 0.01, "{r:#}");
    // --try expandable_segments on the real fragmentation OOM (tests/gpu/frag.py): it fits with it.
    let tried = &read_json(&dir.join("try.report.json"))["tried"];
    assert_eq!(tried["fits_now"], true, "{tried:#}");
    assert_eq!(tried["before"]["oom_cause"], "fragmentation");
    assert_eq!(tried["after"]["outcome"], "fits");
}

#[test]
fn each_run_is_ended_like_a_ctrl_c_after_its_steps() {
    let m = Machine::h200s(1);
    let (_, r, stderr) = fit(&m, &["--steps", "3", "--max", "2"]);
    let first = &r["runs"][0];
    assert_eq!(first["outcome"], "fits", "{stderr}");
    // The loop never ends by itself: gpudoc's SIGINT ended it, as KeyboardInterrupt (death by SIGINT).
    assert_eq!(first["exit_code"], 130, "{stderr}");
    assert!(stderr.contains("\nKeyboardInterrupt"), "{stderr}");
    // Each end is said before its traceback, and once that the traceback is gpudoc's Ctrl-C.
    let said = stderr
        .match_indices("optimizer steps ran: SIGINT to the job, as a Ctrl-C")
        .count();
    assert_eq!(said, runs(&r).len(), "{stderr}");
    assert_eq!(
        stderr
            .matches("is this Ctrl-C, not a fault of the program")
            .count(),
        1,
        "{stderr}"
    );
    let (told, traceback) = (
        stderr.find("SIGINT to the job").unwrap(),
        stderr.find("\nKeyboardInterrupt").unwrap(),
    );
    assert!(told < traceback, "{stderr}");
    let steps = first["steps"].as_u64().unwrap();
    assert!((3..10).contains(&steps), "{steps}");
    assert_eq!(r["answer"], 2);
}

/// `gpudoc fit --json fit.json --steps 3 --max 1 -- args...` run on `m` with the fake torch: (result,
/// stderr).
fn fit_cmd(m: &Machine, args: &[&str]) -> (serde_json::Value, String) {
    let (_, result, stderr) = fit_of(m, &["--steps", "3", "--max", "1"], args);
    (result, stderr)
}

#[test]
fn a_wrapped_command_gets_the_ctrl_c_at_the_end_of_a_run() {
    // Under a shell that waits (`bash -c '...; ...'`, `sh train.sh`) a SIGINT to the shell alone never
    // reached Python: the run was ended by SIGTERM to the shell 5 s later, Python left running.
    let m = Machine::h200s(1);
    let batch = fake_torch().join("batch.py");
    let script = format!(
        "python3 '{}' --batch-size {{}}; echo after",
        batch.display()
    );
    let (r, stderr) = fit_cmd(&m, &["bash", "-c", &script]);
    let first = &r["runs"][0];
    assert!(stderr.contains("KeyboardInterrupt"), "{stderr}");
    assert_eq!(first["outcome"], "fits", "{stderr}");
    assert_eq!(first["exit_code"], 130, "{stderr}");
    assert!(!stderr.contains("SIGTERM"), "{stderr}");
}

/// batch.py's loop at the command's value, run by `python3 -c` with `handler` as its KeyboardInterrupt
/// handler's body (indented by four spaces).
fn loop_handling_ctrl_c(handler: &str) -> Vec<String> {
    let program = format!(
        "import runpy, signal, sys, time\n\
         sys.argv = ['batch.py', '--batch-size', sys.argv[1]]\n\
         try:\n    runpy.run_path({:?}, run_name='__main__')\n\
         except KeyboardInterrupt:\n{handler}\n",
        fake_torch().join("batch.py").display().to_string()
    );
    ["python3", "-c", &program, "{}"].map(String::from).to_vec()
}

#[test]
fn a_checkpoint_saved_on_ctrl_c_is_never_cut_short() {
    // The handler writes 80,000 bytes over 8 s: SIGTERM 5 s after the SIGINT cut it at 50,000.
    let m = Machine::h200s(1);
    let ckpt = m.path("ckpt");
    let handler = format!(
        "    with open({:?}, 'wb') as f:\n        for i in range(8):\n            f.write(b'x' * 10000); f.flush(); time.sleep(1)",
        ckpt.display().to_string()
    );
    let args = loop_handling_ctrl_c(&handler);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (r, stderr) = fit_cmd(&m, &args);
    assert_eq!(std::fs::metadata(&ckpt).unwrap().len(), 80_000, "{stderr}");
    assert_eq!(r["runs"][0]["outcome"], "fits", "{stderr}");
    assert!(!stderr.contains("SIGTERM"), "{stderr}");
}

#[test]
fn a_run_that_does_not_end_on_ctrl_c_is_no_fit() {
    // It ignores the SIGINT and sits silent: gpudoc goes on to SIGTERM, says so, and does not count the
    // run as a fit.
    let m = Machine::h200s(1);
    let args =
        loop_handling_ctrl_c("    signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (r, stderr) = fit_cmd(&m, &args);
    let first = &r["runs"][0];
    assert_eq!(first["outcome"], "failed", "{stderr}");
    assert_eq!(first["exit_code"], 143, "{stderr}");
    assert!(
        stderr
            .contains("gpudoc: the job still runs 5 s after SIGINT: SIGTERM to its process group"),
        "{stderr}"
    );
    assert!(stderr.contains("did not end on SIGINT"), "{stderr}");
}

#[test]
fn the_runs_and_the_budget_are_printed_first_and_never_exceeded() {
    let m = Machine::h200s(1);
    let (code, r, stderr) = fit(&m, &["--runs", "2", "--budget", "10m"]);
    assert!(
        stderr.starts_with(
            "gpudoc fit: values 1 to 1048576, at most 2 runs and 10m; each run is ended after 5 optimizer steps"
        ),
        "{stderr}"
    );
    assert_eq!(runs(&r).len(), 2, "{stderr}");
    assert_eq!(r["stop"], "runs");
    assert_eq!(r["verified"], false);
    assert_eq!(r["answer"], 2, "the largest that fit so far");
    assert_eq!(code, 3);
}

#[test]
fn a_command_without_a_placeholder_is_refused_before_anything_runs() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args(["fit", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `{}` in it"));
}

#[test]
fn a_run_still_going_when_the_budget_is_spent_is_ended_and_the_fit_stops() {
    let m = Machine::h200s(1);
    let started = std::time::Instant::now();
    let (code, r, stderr) = fit(&m, &["--budget", "2s", "--steps", "100000"]);
    let took = started.elapsed();
    assert_eq!(runs(&r), vec![(1, "cut".to_string())], "{stderr}");
    assert_eq!(r["stop"], "budget");
    assert_eq!(r["answer"], serde_json::Value::Null);
    assert_eq!(code, 3);
    // The budget, plus the run's own end (SIGINT is enough for this loop) and gpudoc's collection.
    assert!(took < std::time::Duration::from_secs(6), "{took:?}");
}

#[test]
fn a_run_that_fails_for_another_reason_stops_the_fit() {
    let m = Machine::h200s(1);
    let json = m.path("fit.json");
    let out = m
        .gpudoc()
        .args(["fit", "--json"])
        .arg(&json)
        .args([
            "--for",
            "10s",
            "--no-torch",
            "--",
            "sh",
            "-c",
            "exit $(( {} > 1 ))",
        ])
        .output()
        .unwrap();
    let r = read_json(&json);
    conforms("fit", &r);
    assert_eq!(
        runs(&r),
        vec![(1, "fits".to_string()), (2, "failed".to_string())]
    );
    assert_eq!(r["stop"], "failed");
    assert_eq!(r["answer"], 1);
    assert_eq!(out.status.code(), Some(4));
}

/// `gpudoc run [extra] -- python3 PROGRAM ARGS` with the fake torch and `envs` (the user's own
/// PYTORCH_CUDA_ALLOC_CONF only as `envs` give it): (exit code, stderr).
fn fake_run(m: &Machine, envs: &[(&str, &str)], extra: &[&str], program: &[&str]) -> (i32, String) {
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .envs(envs.iter().copied())
        .arg("run")
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(fake_torch().join(program[0]))
        .args(&program[1..])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gpudoc run [extra] -- python3 fragments.py` with the fake torch and `envs`.
fn fragments(m: &Machine, envs: &[(&str, &str)], extra: &[&str]) -> (i32, String) {
    fake_run(m, envs, extra, &["fragments.py"])
}

#[test]
fn a_fragmentation_oom_gets_try_expandable_segments_proposed() {
    let m = Machine::h200s(1);
    let (code, stderr) = fragments(&m, &[], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cause: fragmentation"), "{stderr}");
    let script = fake_torch().join("fragments.py");
    assert!(
        stderr.contains(&format!(
            "  try: gpudoc run --try expandable_segments -- python3 {} (",
            script.display()
        )),
        "{stderr}"
    );
}

#[test]
fn try_expandable_segments_reruns_with_it_merged_into_the_users_allocator_settings() {
    let m = Machine::h200s(1);
    let json = m.path("after.json");
    let (code, stderr) = fragments(
        &m,
        &[(
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size_mb:128,expandable_segments:False",
        )],
        &[
            "--try",
            "expandable_segments",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        stderr.starts_with("gpudoc run --try expandable_segments:True: 2 runs"),
        "{stderr}"
    );
    // The first run as the user set it, the second with the remedy merged in (their other key kept).
    assert!(
        stderr
            .contains("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:False\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "  as is      out of memory (fragmentation): 2 steps, peak 99.08 GiB, fragmentation 58.59 GiB\n"
        ),
        "{stderr}"
    );
    // Ended once it ran 5 steps past where the first run ran out (at the shim's first record past them).
    let with = stderr
        .split("  with it    fits: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{stderr}"));
    let steps: u64 = with.split(' ').next().unwrap().parse().unwrap();
    assert!(steps >= 7, "{stderr}");
    assert!(
        with.contains("steps, peak 99.08 GiB, fragmentation 0 B\n"),
        "{stderr}"
    );
    assert_eq!(code, 0, "{stderr}");
    // The report is the remedy's run; `tried` holds both, measured as said.
    let r = read_json(&json);
    conforms("report", &r);
    assert_eq!(r["exit"]["classification"], "signal");
    let tried = &r["tried"];
    assert_eq!(tried["remedy"], "expandable_segments:True");
    assert_eq!(
        tried["alloc_conf"],
        "max_split_size_mb:128,expandable_segments:True"
    );
    assert_eq!(tried["fits_now"], true);
    let (before, after) = (&tried["before"], &tried["after"]);
    assert_eq!(before["outcome"], "oom");
    assert_eq!(before["oom_cause"], "fragmentation");
    assert_eq!(before["steps"], 2);
    assert_eq!(before["exit_code"], 1);
    // The OOM text's "58.59 GiB" reserved but unallocated: 60000 MiB, to its two decimals.
    let fragmented = before["fragmentation_bytes"].as_u64().unwrap();
    assert!(fragmented.abs_diff(60000 << 20) < 16 << 20, "{fragmented}");
    assert_eq!(after["outcome"], "fits");
    assert_eq!(after["fragmentation_bytes"], 0);
    assert_eq!(after["steps"], r["torch"]["processes"][0]["steps_total"]);
    let peak = (500 + 40960 + 60000u64) << 20;
    assert_eq!(before["peak_bytes"], peak);
    assert_eq!(after["peak_bytes"], peak);
    assert_eq!(after["command"], r["command"]);
}

#[test]
fn try_keeps_the_first_runs_files_beside_the_remedys_run_instead_of_overwriting_them() {
    let m = Machine::h200s(1);
    let out = m.path("out");
    std::fs::create_dir(&out).unwrap();
    let p = |name: &str| out.join(name).to_str().unwrap().to_string();
    let (code, stderr) = fragments(
        &m,
        &[],
        &[
            "--try",
            "expandable_segments",
            "--json",
            &p("r.json"),
            "--trace",
            &p("r.trace.jsonl"),
            "--html",
            &p("r.html"),
            "--tensorboard",
            &p("tb"),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    // The command as is: its OOM, in its own report, trace and page.
    let first = read_json(&out.join("r.as-is.json"));
    conforms("report", &first);
    assert_eq!(first["oom"]["cause"], "fragmentation", "{first:#}");
    assert!(first["tried"].is_null());
    let trace = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    assert!(trace("r.as-is.trace.jsonl").contains("CUDA out of memory"));
    // The remedy's run where the user said, with both runs in `tried`.
    let last = read_json(&out.join("r.json"));
    assert_eq!(last["tried"]["fits_now"], true);
    assert!(last["oom"].is_null(), "{last:#}");
    assert!(!trace("r.trace.jsonl").contains("CUDA out of memory"));
    for page in ["r.as-is.html", "r.html"] {
        assert!(trace(page).contains("<html"), "{page}");
    }
    // Two TensorBoard runs side by side: the remedy's, and the command as is.
    for run in ["tb/gpudoc", "tb/as-is/gpudoc"] {
        let events = std::fs::read_dir(out.join(run)).unwrap().count();
        assert_eq!(events, 1, "{run}");
    }
}

#[test]
fn try_writes_only_the_remedys_report_to_a_stream() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .args([
            "run",
            "--try",
            "expandable_segments",
            "--json",
            "/dev/stdout",
        ])
        .arg("--")
        .arg("python3")
        .arg(fake_torch().join("fragments.py"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // One report, the remedy's (the program itself prints nothing on stdout); none left in /dev.
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(r["tried"]["fits_now"], true);
    assert!(!std::path::Path::new("/dev/stdout.as-is").exists());
}

#[test]
fn try_refuses_the_ci_gates_flags_before_anything_runs() {
    // The gate judges one run; --try makes two: a --max-peak that judged neither would pass silently.
    let m = Machine::h200s(1);
    let ran = m.path("ran");
    for gate in [&["--max-peak", "40GiB"][..], &["--fail-on", "warn"]] {
        let out = m
            .gpudoc()
            .args(["run", "--try", "expandable_segments"])
            .args(gate)
            .args(["--", "touch"])
            .arg(&ran)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(
            stderr.contains("'--try <REMEDY>' cannot be used with"),
            "{stderr}"
        );
        assert!(!ran.exists());
    }
}

/// `gpudoc run [extra] -- python3 batch.py --batch-size MARK --steps 50` with the fake torch.
fn batch(m: &Machine, extra: &[&str], mark: &str) -> (i32, String) {
    fake_run(
        m,
        &[],
        extra,
        &["batch.py", "--batch-size", mark, "--steps", "50"],
    )
}

#[test]
fn an_oom_of_the_jobs_own_growth_gets_half_its_batch_proposed() {
    let m = Machine::h200s(1);
    let (code, stderr) = batch(&m, &[], "81");
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cause: the job's own growth"), "{stderr}");
    let script = fake_torch().join("batch.py");
    assert!(
        stderr.contains(&format!(
            "  try: gpudoc run --try '{{}}=40' -- python3 {} --batch-size '{{81}}' --steps 50 (reruns it as is and at 40, and compares)\n",
            script.display()
        )),
        "{stderr}"
    );
}

#[test]
fn try_a_smaller_value_runs_the_marked_parameter_as_is_then_at_that_value() {
    let m = Machine::h200s(1);
    let json = m.path("try.json");
    let (code, stderr) = batch(
        &m,
        &[
            "--quiet",
            "--try",
            "{}=80",
            "--json",
            json.to_str().unwrap(),
        ],
        "{81}",
    );
    assert!(
        stderr.starts_with(
            "gpudoc run --try {}=80: 2 runs, the command as is (at 81), then at 80 (to its end, or 5 optimizer steps past where the first ran out)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "\n  at 81      out of memory (the job's own growth): 0 steps, peak 16.49 GiB"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("\n  at 80      fits: "), "{stderr}");
    assert_eq!(code, 0, "{stderr}");
    let r = read_json(&json);
    conforms("report", &r);
    let tried = &r["tried"];
    assert_eq!(tried["remedy"], "{}=80");
    assert_eq!(tried["alloc_conf"], serde_json::Value::Null);
    assert_eq!(tried["fits_now"], true);
    let arg = |side: &str| tried[side]["command"][3].clone();
    assert_eq!((arg("before"), arg("after")), ("81".into(), "80".into()));
    assert_eq!(tried["before"]["outcome"], "oom");
    assert_eq!(
        tried["after"]["peak_bytes"],
        (500 + 16384 + 80 * 1568u64) << 20
    );
    // Ended 5 steps past where the first ran out (at its start), not at its own 50.
    let steps = tried["after"]["steps"].as_u64().unwrap();
    assert!((5..50).contains(&steps), "{steps}");
}

#[test]
fn try_a_value_needs_the_parameter_marked_with_its_value_as_is_before_anything_runs() {
    let m = Machine::h200s(1);
    for (mark, says) in [
        ("{}", "write it inside the braces (`--batch-size {64}`)"),
        ("81", "no parameter marked in the command"),
        ("{80}", "80 is the value as is: give another"),
    ] {
        let (code, stderr) = batch(&m, &["--try", "{}=80"], mark);
        assert_eq!(code, 125, "{stderr}");
        assert!(stderr.starts_with("gpudoc: --try {}=80: "), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(!stderr.contains("2 runs"), "{stderr}");
    }
}

/// A training loop (batch.py at the command's value, or at `{}`) that says `ready` on stdout once Python
/// runs, and that saves and exits 0 on KeyboardInterrupt, as a script with a checkpoint handler does.
fn catching_loop(batch: &str) -> Vec<String> {
    let program = format!(
        "import runpy, sys\n\
         sys.argv = ['batch.py', '--batch-size', sys.argv[1]]\n\
         print('ready', flush=True)\n\
         try:\n    runpy.run_path({:?}, run_name='__main__')\n\
         except KeyboardInterrupt:\n    print('saved', file=sys.stderr)\n",
        fake_torch().join("batch.py").display().to_string()
    );
    ["python3", "-c", &program, batch]
        .map(String::from)
        .to_vec()
}

/// `gpudoc args` in a process group of its own, as a shell runs a job, Ctrl-C'd (SIGINT to the whole
/// group, as the terminal sends it) once the job said `ready`: how gpudoc ended, how long it took, and
/// its stderr.
fn ctrl_c(m: &Machine, args: &[String]) -> (std::process::ExitStatus, std::time::Duration, String) {
    use nix::sys::signal::{Signal, killpg};
    use std::os::unix::process::CommandExt;
    let err = m.path("stderr");
    let mut child = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(args)
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    assert_eq!(common::line_of(&mut child), "ready\n");
    // The job is past its first steps: what it does on Ctrl-C is its own handler's doing.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let sent = std::time::Instant::now();
    killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    (status, took, std::fs::read_to_string(err).unwrap())
}

#[test]
fn ctrl_c_stops_the_fit_after_its_run_and_gpudoc_dies_of_it_as_the_job_would() {
    use std::os::unix::process::ExitStatusExt;
    let m = Machine::h200s(1);
    let json = m.path("fit.json");
    let mut args: Vec<String> = ["fit", "--steps", "100000", "--budget", "30s", "--json"]
        .map(String::from)
        .to_vec();
    args.push(json.display().to_string());
    args.push("--".into());
    // The job saves and exits 0 on Ctrl-C: the fit must stop all the same, not take it as a fit.
    args.extend(catching_loop("{}"));
    let (status, took, stderr) = ctrl_c(&m, &args);
    // Died of SIGINT, so a shell loop around it stops (a shell sees 130).
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?} {stderr}");
    assert!(stderr.contains("saved"), "{stderr}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    // The result so far was written before: one run, interrupted.
    let r = read_json(&json);
    conforms("fit", &r);
    assert_eq!(runs(&r), vec![(1, "interrupted".to_string())], "{stderr}");
    assert_eq!(r["stop"], "interrupted");
}

#[test]
fn ctrl_c_during_try_stops_before_the_remedys_run_and_gpudoc_dies_of_it() {
    use std::os::unix::process::ExitStatusExt;
    let m = Machine::h200s(1);
    let json = m.path("try.json");
    let mut args: Vec<String> = [
        "run",
        "--try",
        "expandable_segments",
        "--try-budget",
        "20s",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    args.push(json.display().to_string());
    args.push("--".into());
    args.extend(catching_loop("10"));
    let (status, took, stderr) = ctrl_c(&m, &args);
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?} {stderr}");
    // The remedy's run never started (it would have run until the budget's end).
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    assert!(stderr.contains("  as is      interrupted: "), "{stderr}");
    assert!(!stderr.contains("with it"), "{stderr}");
    let r = read_json(&json);
    conforms("report", &r);
    assert_eq!(r["tried"]["before"]["outcome"], "interrupted");
    assert_eq!(r["tried"]["after"], serde_json::Value::Null);
    assert_eq!(r["tried"]["fits_now"], false);
}

#[test]
fn ctrl_c_typed_on_the_terminal_stops_the_fit_after_its_run() {
    // On a terminal the job has one of its own, and gets the key from gpudoc: the key is the news.
    let m = Machine::h200s(1);
    let json = m.path("fit.json");
    let mut c = m.gpudoc();
    c.env("PYTHONPATH", fake_torch())
        .args(["fit", "--steps", "100000", "--budget", "20s", "--json"])
        .arg(&json)
        .arg("--")
        .args(catching_loop("{}"));
    let mut t = common::term::Term::start(c);
    t.expect("ready");
    std::thread::sleep(std::time::Duration::from_millis(300));
    t.type_bytes(b"\x03");
    let (code, out) = t.finish();
    assert_eq!(code, 130, "{out}");
    assert!(out.contains("saved"), "{out}");
    assert_eq!(
        runs(&read_json(&json)),
        vec![(1, "interrupted".to_string())],
        "{out}"
    );
}

/// A job that leaves two processes holding GPU memory: one it started with `nohup` (1 GiB), one it did not
/// (2 GiB).
const LEAVES_TWO: &str = r#"nohup "$FAKEGPU" alloc --steps 1GiB --hold-ms 20001 >/dev/null 2>&1 &
( "$FAKEGPU" alloc --steps 2GiB --hold-ms 20002 >/dev/null & ); sleep 0.5"#;

#[test]
fn try_ends_what_each_run_leaves_and_charges_no_run_with_an_earlier_ones() {
    let m = Machine::h200s(1);
    let json = m.path("r.json");
    let out = m
        .gpudoc()
        .args(["run", "--try", "expandable_segments", "--json"])
        .arg(&json)
        .args(["--", "sh", "-c", LEAVES_TWO])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (first, last) = (read_json(&m.path("r.as-is.json")), read_json(&json));
    let left = |r: &serde_json::Value| -> Vec<(u64, String)> {
        r["orphans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let outcome = o["ended"]["outcome"].as_str().unwrap_or("none");
                (o["pid"].as_u64().unwrap(), outcome.to_string())
            })
            .collect()
    };
    let (first_left, last_left) = (left(&first), left(&last));
    for (pid, _) in &last_left {
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Each run's leftovers are ended after it, but for the one it detached on purpose ...
    let outcomes = |l: &[(u64, String)]| {
        let mut o: Vec<String> = l.iter().map(|x| x.1.clone()).collect();
        o.sort();
        o
    };
    assert_eq!(outcomes(&first_left), ["ended", "skipped"], "{first:#}");
    assert_eq!(outcomes(&last_left), ["ended", "skipped"], "{last:#}");
    // ... which is ended before the remedy's run, and not counted as that run's.
    let spared = first_left.iter().find(|x| x.1 == "skipped").unwrap().0;
    assert!(
        stderr.contains(&format!(
            "before the next run, ended what an earlier one left running: pid {spared} "
        )),
        "{stderr}"
    );
    let tried = &last["tried"];
    assert_eq!(
        tried["after"]["peak_bytes"], tried["before"]["peak_bytes"],
        "{tried:#}"
    );
    assert_eq!(last_left.len(), 2, "only the remedy's run's own: {last:#}");
    // What the last run left running is said, and recorded for `gpudoc orphans`.
    let kept = last_left.iter().find(|x| x.1 == "skipped").unwrap().0;
    assert!(stderr.contains("the last run left running"), "{stderr}");
    let record = std::fs::read_to_string(m.path("state/gpudoc/leftovers.json")).unwrap();
    assert!(record.contains(&format!("\"pid\": {kept}")), "{record}");
}

#[test]
fn try_gives_a_file_input_to_both_runs_and_says_where_a_pipes_went() {
    let m = Machine::h200s(1);
    let input = m.path("input.txt");
    std::fs::write(&input, "1\n2\n3\n").unwrap();
    let counts = |stdin: std::process::Stdio| {
        let out = m
            .gpudoc()
            .args(["run", "-q", "--try", "expandable_segments"])
            .args(["--", "sh", "-c", "wc -l"])
            .stdin(stdin)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (seen, _) = counts(std::fs::File::open(&input).unwrap().into());
    assert_eq!(seen, "3 3", "each run reads the file from its start");
    let mut feed = std::process::Command::new("printf")
        .arg("1\\n2\\n3\\n")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (seen, stderr) = counts(feed.stdout.take().unwrap().into());
    feed.wait().unwrap();
    assert_eq!(seen, "3 0", "a pipe is read once");
    assert!(
        stderr.contains("the command's input is a pipe, which can be read once"),
        "{stderr}"
    );
}

#[test]
fn fit_ends_a_runs_nohup_helper_before_the_next_and_says_and_records_the_last_ones() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args(["fit", "--max", "2", "--for", "10s", "--no-torch", "--"])
        .args([
            "sh",
            "-c",
            r#"nohup "$FAKEGPU" alloc --steps {}GiB --hold-ms 20000 >/dev/null 2>&1 & sleep 0.3"#,
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let record = std::fs::read_to_string(m.path("state/gpudoc/leftovers.json")).unwrap_or_default();
    let kept: Vec<u32> = serde_json::from_str::<serde_json::Value>(&record)
        .map(|r| {
            r["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["pid"].as_u64().unwrap() as u32)
                .collect()
        })
        .unwrap_or_default();
    for pid in &kept {
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("before the next run, ended what an earlier one left running: pid "),
        "{stderr}"
    );
    assert!(stderr.contains("the last run left running"), "{stderr}");
    assert!(stderr.contains("detached on purpose"), "{stderr}");
    assert_eq!(kept.len(), 1, "the last run's helper is recorded: {record}");
}
