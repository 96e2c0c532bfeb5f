//! Shared test fixtures: a scripted fake GPU machine (the fake NVML library and its state file) and
//! gpudoc commands wired to it.

#![allow(dead_code)]

pub mod http;
pub mod term;

use fake_nvml::state::State;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

/// target/<profile>, found from this test binary (target/<profile>/deps/<test>).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The fake libnvidia-ml.so. `cargo test --workspace` builds it (fake-nvml's own test needs it).
pub fn fake_lib() -> PathBuf {
    let p = target_dir().join("deps").join("libfake_nvml.so");
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        p.display()
    );
    p
}

/// The `fakegpu` helper binary.
pub fn fakegpu() -> String {
    let p = target_dir().join("fakegpu");
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

pub fn gpudoc_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpudoc"))
}

/// A fake machine: a temp folder with the state file.
pub struct Machine {
    pub dir: TempDir,
}

impl Machine {
    pub fn h200s(n: u32) -> Machine {
        Machine::with(State::h200s(n))
    }

    pub fn with(state: State) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        state.store(&dir.path().join("state.json")).unwrap();
        Machine { dir }
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `gpudoc` with the fake NVML and this machine's state, colours off, not in CI mode.
    pub fn gpudoc(&self) -> Command {
        let mut c = Command::new(gpudoc_bin());
        self.fake_env(&mut c);
        c
    }

    /// `bash -c script` in the same environment as [`Machine::gpudoc`], with gpudoc's path in `$GPUDOC`:
    /// for gpudoc inside a shell pipeline.
    pub fn shell(&self, script: &str) -> Command {
        let mut c = Command::new("bash");
        c.args(["-c", script]).env("GPUDOC", gpudoc_bin());
        self.fake_env(&mut c);
        c
    }

    /// A CI step or an sbatch script: `gpudoc run` leaves a process holding 2 GiB, then the script goes on
    /// (its shell leads the process group of what it started, the leftover included). The script's stdout
    /// says `ran` once gpudoc has exited; the run's report comes back with it.
    pub fn script_with_a_leftover(
        &self,
        run_flags: &str,
    ) -> (std::process::Child, serde_json::Value) {
        let json = self.path("report.json");
        let mut script = self.shell(&format!(
            r#""$GPUDOC" run -q {run_flags} --json {} -- sh -c '"$FAKEGPU" alloc --steps 2GiB --hold-ms 30000 >/dev/null & sleep 0.3'; echo ran; sleep 30"#,
            json.display()
        ));
        let mut script = script
            .process_group(0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        assert_eq!(line_of(&mut script), "ran\n");
        (script, read_json(&json))
    }

    /// The fake GPU tool (alloc, set, ...) on this machine.
    pub fn fakegpu(&self) -> Command {
        let mut c = Command::new(fakegpu());
        c.env("FAKE_NVML_STATE", self.state_path());
        c
    }

    fn fake_env(&self, c: &mut Command) {
        c.env("GPUDOC_NVML_LIB", fake_lib())
            .env("FAKE_NVML_STATE", self.state_path())
            .env("FAKEGPU", fakegpu())
            .env("NO_COLOR", "1")
            // What `gpudoc run` records it left running goes to this machine's folder, not the user's.
            .env("XDG_STATE_HOME", self.path("state"))
            .env_remove("CI");
    }

    /// Starts `script` under a new session leader `sh`, reads the PID it prints, then kills the leader: what
    /// the script started is left an orphan whose job leader is gone (re-parented to init or a subreaper).
    pub fn orphan(&self, script: &str, as_uid: Option<u32>) -> u32 {
        let mut c = Command::new("sh");
        c.args(["-c", &format!("{script} & echo $!; wait")])
            .env("FAKE_NVML_STATE", self.state_path())
            .env("FAKEGPU", fakegpu())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        unsafe {
            c.pre_exec(move || {
                libc::setsid();
                if let Some(uid) = as_uid {
                    libc::setgid(uid);
                    libc::setuid(uid);
                }
                Ok(())
            });
        }
        let mut leader = c.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(leader.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let pid: u32 = line.trim().parse().unwrap();
        leader.kill().unwrap();
        leader.wait().unwrap();
        // Until the orphan has registered its memory (or opened its file), it is not worth listing.
        std::thread::sleep(Duration::from_millis(300));
        pid
    }

    /// How many times the fake library's functions were called (written at nvmlShutdown).
    pub fn calls(&self) -> serde_json::Value {
        let text = std::fs::read(self.path("state.json.calls")).expect("the calls file");
        serde_json::from_slice(&text).unwrap()
    }

    /// Runs `gpudoc run --json report.json [extra] -- python3 ARGS` with the fake torch first on the path
    /// and `envs` set: (exit code, report, stdout, stderr).
    pub fn python(
        &self,
        envs: &[(&str, &str)],
        extra: &[&str],
        args: &[&str],
    ) -> (i32, serde_json::Value, String, String) {
        self.python_with("python3", envs, extra, args)
    }

    /// [`Machine::python`] with another interpreter than `python3`.
    pub fn python_with(
        &self,
        python: &str,
        envs: &[(&str, &str)],
        extra: &[&str],
        args: &[&str],
    ) -> (i32, serde_json::Value, String, String) {
        let json = self.path("report.json");
        let out = self
            .gpudoc()
            .env("PYTHONPATH", fake_torch())
            .envs(envs.iter().copied())
            .arg("run")
            .arg("--json")
            .arg(&json)
            .args(extra)
            .arg("--")
            .arg(python)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            read_json(&json),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs `gpudoc run --json report.json -- sh -c SCRIPT` and returns (exit code, report, stderr).
    pub fn run_sh(&self, extra: &[&str], script: &str) -> (i32, serde_json::Value, String) {
        let json = self.path("report.json");
        let out = self
            .gpudoc()
            .arg("run")
            .arg("--json")
            .arg(&json)
            .args(extra)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap();
        let report = read_json(&json);
        if json.exists() {
            conforms("report", &report);
        }
        (
            shell_code(&out.status),
            report,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// gpudoc proper: the child of the guard `guard` (the PID the caller started) named `gpudoc` (its other
/// child is the job keeper).
pub fn gpudoc_under(guard: u32) -> i32 {
    let children = format!("/proc/{guard}/task/{guard}/children");
    std::fs::read_to_string(children)
        .unwrap()
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "gpudoc")
        })
        .expect("gpudoc under its guard")
}

/// The Python that has the packages the tests read with (tensorboard, coverage): the test environment
/// `.ci/deps` makes in target/test-venv (Debian's own Python refuses pip installs), else `python3`.
pub fn python_with_packages() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// The path of a tool of Debian's `prometheus` package (`prometheus`, `promtool`), which .ci/deps installs.
pub fn tool(name: &str) -> String {
    let path = format!("/usr/bin/{name}");
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: .ci/run installs Debian's prometheus package (apt-get install prometheus)"
    );
    path
}

/// What a shell's `$?` says of an exit status: the code, or 128+N for death by signal N.
pub fn shell_code(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The next line `child` writes to its piped stdout (what there is at its end). Read a byte at a time, so
/// nothing after the line is taken from the pipe: the next call reads on from there.
pub fn line_of(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let out = child.stdout.as_mut().expect("a piped stdout");
    let mut line = Vec::new();
    let mut byte = [0u8];
    while out.read(&mut byte).unwrap() == 1 {
        line.push(byte[0]);
        if byte[0] == b'\n' {
            break;
        }
    }
    String::from_utf8_lossy(&line).into_owned()
}

/// Files under fixtures/ whose name ends with `suffix`, sorted.
pub fn fixture_files(suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.to_string_lossy().ends_with(suffix) {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

/// The published JSON Schema `docs/schema/NAME.schema.json`.
pub fn schema(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/schema")
        .join(format!("{name}.schema.json"));
    read_json(&path)
}

/// Fails unless `value` conforms to the published schema `name`, naming every place it does not.
pub fn conforms(name: &str, value: &serde_json::Value) {
    static VALIDATORS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<jsonschema::Validator>>>,
    > = std::sync::OnceLock::new();
    let v = VALIDATORS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(name.to_string())
        .or_insert_with(|| std::sync::Arc::new(jsonschema::validator_for(&schema(name)).unwrap()))
        .clone();
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .take(5)
        .collect();
    assert!(
        errors.is_empty(),
        "not a {name} by docs/schema: {errors:#?}"
    );
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap()
}

/// fixtures/fake_torch: a stand-in `torch` package.
pub fn fake_torch() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_torch")
}

/// Runs `c`; fails, showing its stderr, unless it succeeded. Its output.
pub fn succeed(c: &mut Command) -> std::process::Output {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `gpudoc report FILE [extra] --json -`: the report, re-diagnosed (the summary goes to stderr).
/// The diagnosis a report's rule `rule` made, if it fired (the first, for a rule of many items).
/// The rules that fired on a report, sorted, each once.
pub fn fired(report: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = report["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["rule"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

pub fn diagnosis<'a>(report: &'a serde_json::Value, rule: &str) -> Option<&'a serde_json::Value> {
    report["diagnoses"]
        .as_array()?
        .iter()
        .find(|d| d["rule"] == rule)
}

/// What `gpudoc report FILE --json -` writes, built in this process by the command's own path
/// (`replay::load` with the bundled rules): for tests that replay many fixtures, where a process each
/// adds only its start-up.
pub fn replayed(file: impl AsRef<Path>) -> serde_json::Value {
    serde_json::from_str(&replay_in_process(file.as_ref()).to_json()).unwrap()
}

/// What `gpudoc report TRACE --live-verdicts --json -` writes and what `gpudoc report TRACE
/// --live-verdicts --color never` prints, built once in this process by the command's own path (the
/// trace's looks judged again are the costly part: a test that wants both gets them from one replay).
pub fn replayed_live(trace: impl AsRef<Path>) -> (serde_json::Value, String) {
    let trace = trace.as_ref();
    let mut r = replay_in_process(trace);
    gpudoc::live::replay::verdicts(trace, bundled_rules())
        .unwrap_or_else(|e| panic!("{}: {e}", trace.display()))
        .annotate(&mut r);
    let json = serde_json::from_str(&r.to_json()).unwrap();
    (
        json,
        gpudoc::summary::render(&r, gpudoc::paint::Paint(false)),
    )
}

/// The rules gpudoc ships, loaded once per test binary.
fn bundled_rules() -> &'static gpudoc::rules::RuleSet {
    static RULES: std::sync::OnceLock<gpudoc::rules::RuleSet> = std::sync::OnceLock::new();
    RULES.get_or_init(|| gpudoc::rules::RuleSet::load(None, &[]).unwrap())
}

fn replay_in_process(file: &Path) -> gpudoc::report::Report {
    gpudoc::replay::load(file, None, bundled_rules())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

pub fn report(file: impl AsRef<Path>, extra: &[&str]) -> serde_json::Value {
    report_of(&[file.as_ref()], extra)
}

/// `gpudoc report FILES... [extra] --json -`: one report, or the nodes' reports merged.
pub fn report_of(
    files: &[impl AsRef<Path>],
    extra: &[impl AsRef<std::ffi::OsStr>],
) -> serde_json::Value {
    let out = succeed(
        Command::new(gpudoc_bin())
            .arg("report")
            .args(files.iter().map(|f| f.as_ref()))
            .args(extra)
            .args(["--json", "-"]),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What `env` printed (`c` runs it), one `NAME=value` a line, sorted.
pub fn env_lines(c: &mut Command) -> Vec<String> {
    let out = c.arg("env").output().unwrap();
    let mut v: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    v.sort();
    v
}

/// Whether `cond` holds within `limit`, asking every 10 ms.
pub fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes `fd` non-blocking (O_NONBLOCK on its open file description, shared with its duplicates).
pub fn set_nonblocking(fd: impl std::os::fd::AsFd) {
    use std::os::fd::AsRawFd;
    let fd = fd.as_fd().as_raw_fd();
    // SAFETY: fcntl on a descriptor the caller holds.
    unsafe {
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
    }
}

/// A real text of fixtures/oom/real/: its name, the file, and the reading it must give.
pub struct RealText {
    pub name: String,
    pub file: PathBuf,
    pub want: serde_json::Value,
}

/// For each GPU vendor, the first real text (by name) that names its device and the first that names
/// none; and the first real text that is no GPU OOM. The way a text reaches gpudoc (stderr, a pipe, a
/// terminal) does not depend on its words; what a run reads of every real text, in every delivery, is
/// checked in-process in tests/oom.rs, and the GPU its report names depends on the vendor and the device
/// the text names.
pub fn one_real_text_per_vendor() -> Vec<RealText> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/oom/real");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".expected.json").map(str::to_string)
        })
        .collect();
    names.sort();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for name in names {
        let want = read_json(&dir.join(format!("{name}.expected.json")));
        let file = [".txt", ".stderr"]
            .iter()
            .map(|ext| dir.join(format!("{name}{ext}")))
            .find(|p| p.exists())
            .unwrap();
        let text = &want["text"];
        let shape = match text["vendor"].as_str() {
            Some(vendor) => format!("{vendor}, a device named: {}", !text["gpu"].is_null()),
            None => "no GPU OOM".to_string(),
        };
        if seen.insert(shape) {
            out.push(RealText { name, file, want });
        }
    }
    out
}
