//! The shim is invisible to the program: each way it once changed or broke one (issue 12), checked
//! against the same program without gpudoc (`--no-torch`) or bare. The fake `torch` stands in for PyTorch.

mod common;

use common::{Machine, fake_torch, read_json};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// Runs `python3 SCRIPT` under `gpudoc run [extra]` with the fake torch on PYTHONPATH.
fn under(m: &Machine, extra: &[&str], script: &Path, env: &[(&str, &str)]) -> Output {
    m.gpudoc()
        .env("PYTHONPATH", fake_torch())
        .envs(env.iter().copied())
        .arg("run")
        .args(["-q", "--json"])
        .arg(m.path("r.json"))
        .args(extra)
        .args(["--", "python3"])
        .arg(script)
        .output()
        .unwrap()
}

fn bare(script: &Path, env: &[(&str, &str)]) -> Output {
    Command::new("python3")
        .env("PYTHONPATH", fake_torch())
        .envs(env.iter().copied())
        .arg(script)
        .output()
        .unwrap()
}

fn write(m: &Machine, name: &str, text: &str) -> std::path::PathBuf {
    let p = m.path(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_programs_own_peaks_are_what_they_would_be_without_gpudoc() {
    let m = Machine::h200s(1);
    let script = write(
        &m,
        "peaks.py",
        r#"
import torch
torch.cuda.init()
opt = torch.optim.SGD()
MiB = 1 << 20
torch.cuda._alloc(1024 * MiB)
for i in range(20):
    torch.cuda._alloc(4096 * MiB); torch.cuda._free(4096 * MiB)
    opt.step()
    if i == 10:
        print("mid", torch.cuda.max_memory_allocated() // MiB)
        torch.cuda.reset_peak_memory_stats()
        torch.cuda._alloc(512 * MiB); torch.cuda._free(512 * MiB)
        print("after reset", torch.cuda.max_memory_allocated() // MiB)
print("end", torch.cuda.max_memory_allocated() // MiB, torch.cuda.memory_stats()["reserved_bytes.all.peak"] // MiB)
"#,
    );
    let b = bare(&script, &[]);
    let g = under(&m, &[], &script, &[]);
    assert!(b.status.success() && g.status.success(), "{}", text(&g));
    assert_eq!(
        String::from_utf8_lossy(&g.stdout),
        String::from_utf8_lossy(&b.stdout)
    );
    assert!(String::from_utf8_lossy(&b.stdout).contains("end 5120 5120"));
    // And gpudoc still saw each step's own peak.
    let r = read_json(&m.path("r.json"));
    let steps = r["torch"]["processes"][0]["steps"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        steps
            .iter()
            .all(|s| s["peak_allocated_bytes"] == 5120u64 << 20),
        "{steps:?}"
    );
}

#[test]
fn nested_gpudoc_and_delegating_finders_import_torch_once_and_leave_no_finder() {
    let m = Machine::h200s(1);
    // A finder that asks every other finder in turn, as tracers' import hooks do.
    let script = write(
        &m,
        "finder.py",
        r#"
import sys
class Delegating:
    def find_spec(self, name, path=None, target=None):
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                return spec
        return None
sys.meta_path.insert(0, Delegating())
import torch
torch.cuda.init()
opt = torch.optim.SGD()
torch.cuda._alloc(1 << 20)
opt.step()
print([type(f).__name__ for f in sys.meta_path])
"#,
    );
    let g = under(&m, &[], &script, &[]);
    assert!(g.status.success(), "{}", text(&g));
    // Once torch is in, sys.meta_path is the program's own and one GpudocFinder, which stays for the
    // other frameworks (a program may import jax after torch) and answers nothing else.
    assert_eq!(
        without_finder(&String::from_utf8_lossy(&g.stdout)),
        String::from_utf8_lossy(&bare(&script, &[]).stdout),
    );
    assert_eq!(
        String::from_utf8_lossy(&g.stdout)
            .matches("'GpudocFinder'")
            .count(),
        1
    );
    let r = read_json(&m.path("r.json"));
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 1, "{r:#}");
    // gpudoc under gpudoc: one shim, the inner one's; torch imports fine.
    let inner = common::gpudoc_bin();
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(["run", "-q", "--"])
        .arg(&inner)
        .args(["run", "-q", "--json"])
        .arg(m.path("inner.json"))
        .args(["--", "python3", "-c"])
        .arg("import torch; torch.cuda.init(); o = torch.optim.SGD(); torch.cuda._alloc(1); o.step(); print(len(torch.optim.optimizer._post_hooks))")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "one hook");
    let r = read_json(&m.path("inner.json"));
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 1, "{r:#}");
}

#[test]
fn a_program_that_reuses_descriptors_gets_nothing_in_its_files() {
    let m = Machine::h200s(1);
    let log = m.path("train.log");
    let script = write(
        &m,
        "fds.py",
        &format!(
            r#"
import os, torch
torch.cuda.init()
opt = torch.optim.SGD()
torch.cuda._alloc(1 << 20)
opt.step()
os.closerange(3, 1024)
log = open({log:?}, "w")
for i in range(5):
    opt.step()
log.write("only the program's own line\n")
log.close()
"#
        ),
    );
    let g = under(&m, &[], &script, &[]);
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "only the program's own line\n"
    );
}

#[test]
fn sigpipe_restored_never_kills_the_program_when_gpudoc_is_gone() {
    let m = Machine::h200s(1);
    let done = m.path("done");
    let trainer = write(
        &m,
        "trainer.py",
        &format!(
            r#"
import signal, time, torch
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
torch.cuda.init()
opt = torch.optim.SGD()
torch.cuda._alloc(1 << 20)
for i in range(30):
    opt.step()
    time.sleep(0.05)
open({done:?}, "w").write("finished")
"#
        ),
    );
    // The trainer runs on in the background after the command (and gpudoc) have ended.
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(["run", "-q", "--", "sh", "-c"])
        .arg(format!("python3 {} & sleep 0.4", trainer.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for _ in 0..100 {
        if done.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read_to_string(&done).unwrap_or_default(),
        "finished",
        "the trainer was killed once gpudoc had left"
    );
}

#[test]
fn odd_ranks_and_a_failing_import_are_the_programs_own() {
    let m = Machine::h200s(1);
    let script = write(
        &m,
        "rank.py",
        "import torch\ntorch.cuda.init()\nopt = torch.optim.SGD()\ntorch.cuda._alloc(1 << 20)\nopt.step()\nprint('ok')\n",
    );
    let g = under(&m, &[], &script, &[("RANK", "²")]);
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(String::from_utf8_lossy(&g.stdout), "ok\n");

    // A torch whose import fails: the traceback is exactly the one without gpudoc.
    let broken = m.path("broken");
    std::fs::create_dir_all(broken.join("torch")).unwrap();
    std::fs::write(
        broken.join("torch/__init__.py"),
        "def f():\n    raise ValueError('no torch here')\nf()\n",
    )
    .unwrap();
    let script = write(&m, "imp.py", "import torch\n");
    let env = [("PYTHONPATH", broken.to_str().unwrap())];
    let b = Command::new("python3")
        .envs(env)
        .arg(&script)
        .output()
        .unwrap();
    let g = m
        .gpudoc()
        .envs(env)
        .args(["run", "-q", "--", "python3"])
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(g.status.code(), b.status.code());
    assert_eq!(
        String::from_utf8_lossy(&g.stderr),
        String::from_utf8_lossy(&b.stderr),
        "the same traceback, no shim frame in it"
    );
}

#[test]
fn fork_children_that_import_torch_are_seen_and_forked_descriptors_are_dropped() {
    let m = Machine::h200s(1);
    let script = write(
        &m,
        "fork.py",
        r#"
import os, sys
pid = os.fork()
if pid == 0:
    import torch
    torch.cuda.init()
    opt = torch.optim.SGD()
    torch.cuda._alloc(1 << 20)
    for _ in range(3):
        opt.step()
    sys.exit(0)
os.waitpid(pid, 0)
import torch
torch.cuda.init()
opt = torch.optim.SGD()
torch.cuda._alloc(1 << 20)
for _ in range(2):
    opt.step()
"#,
    );
    let g = under(&m, &[], &script, &[]);
    assert!(g.status.success(), "{}", text(&g));
    let r = read_json(&m.path("r.json"));
    let mut steps: Vec<u64> = r["torch"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["steps_total"].as_u64().unwrap())
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        vec![2, 3],
        "the parent and its forked child, each with its own steps"
    );
}

#[test]
fn the_environments_sitecustomize_runs_even_without_the_pipe() {
    let m = Machine::h200s(1);
    let site = m.path("site");
    std::fs::create_dir(&site).unwrap();
    let marker = m.path("marker");
    std::fs::write(
        site.join("sitecustomize.py"),
        format!("open({:?}, 'a').write('ran ')\n", marker.to_str().unwrap()),
    )
    .unwrap();
    // A tool that keeps PYTHONPATH but drops gpudoc's other variables (tox, sudo's allow-lists).
    let out = m
        .gpudoc()
        .env("PYTHONPATH", &site)
        .args([
            "run",
            "-q",
            "--",
            "env",
            "-u",
            "GPUDOC_TORCH",
            "python3",
            "-c",
            "pass",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran ");
}

#[test]
fn a_tmpdir_with_a_colon_puts_nothing_odd_on_sys_path() {
    let m = Machine::h200s(1);
    let odd = m.path("a:b");
    std::fs::create_dir(&odd).unwrap();
    let out = m
        .gpudoc()
        .env("TMPDIR", &odd)
        .args(["run", "-q", "--", "python3", "-c"])
        .arg("import sys; print([p for p in sys.path if 'a:b' in p or p.endswith('/a')])")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn a_loader_with_only_load_module_is_still_seen() {
    let m = Machine::h200s(1);
    let script = write(
        &m,
        "legacy.py",
        &format!(
            r#"
import importlib.util, sys
class Legacy:
    def load_module(self, fullname):
        spec = importlib.util.spec_from_file_location(
            "torch", {init:?}, submodule_search_locations=[{dir:?}])
        module = importlib.util.module_from_spec(spec)
        sys.modules["torch"] = module
        spec.loader.exec_module(module)
        return module
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            return importlib.util.spec_from_loader("torch", Legacy())
sys.meta_path.insert(1, Finder())
import torch
torch.cuda.init()
opt = torch.optim.SGD()
torch.cuda._alloc(1 << 20)
opt.step()
"#,
            init = fake_torch().join("torch/__init__.py"),
            dir = fake_torch().join("torch"),
        ),
    );
    let out = m
        .gpudoc()
        .args(["run", "-q", "--json"])
        .arg(m.path("r.json"))
        .args(["--", "python3"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let r = read_json(&m.path("r.json"));
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 1, "{r:#}");
}

/// A program that steps once on the fake torch, after `prelude`.
fn one_step(prelude: &str) -> String {
    format!(
        "{prelude}\nimport torch\ntorch.cuda.init()\nopt = torch.optim.SGD()\ntorch.cuda._alloc(1 << 20)\nopt.step()\n"
    )
}

fn steps_total(m: &Machine) -> Value {
    read_json(&m.path("r.json"))["torch"]["processes"][0]["steps_total"].clone()
}

#[test]
fn a_class_that_is_its_own_loader_imports_torch() {
    // Meta-path importers that are their own loader, as BuiltinImporter and FrozenImporter are: with a
    // staticmethod exec_module, and with one inherited.
    for (name, body) in [
        (
            "static",
            "    @staticmethod\n    def exec_module(module):\n        run(module)\n",
        ),
        ("inherited", "    pass\n"),
    ] {
        let m = Machine::h200s(1);
        let prelude = format!(
            r#"
import importlib.machinery, sys
def run(module):
    path = {init:?}
    exec(compile(open(path).read(), path, "exec"), module.__dict__)
class Base:
    @staticmethod
    def exec_module(module):
        run(module)
class Importer(Base):
{body}    @staticmethod
    def create_module(spec):
        return None
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "torch":
            spec = importlib.machinery.ModuleSpec("torch", cls, is_package=True)
            spec.submodule_search_locations = [{dir:?}]
            return spec
sys.meta_path.insert(1, Importer)
"#,
            init = fake_torch().join("torch/__init__.py"),
            dir = fake_torch().join("torch"),
        );
        let script = write(
            &m,
            "own_loader.py",
            &(one_step(&prelude)
                + "print(torch.__loader__ is Importer, torch.__spec__.loader is Importer)\n"),
        );
        let g = under(&m, &[], &script, &[]);
        assert!(g.status.success(), "{name}: {}", text(&g));
        assert_eq!(String::from_utf8_lossy(&g.stdout), "True True\n", "{name}");
        assert_eq!(steps_total(&m), 1, "{name}");
    }
}

#[test]
fn a_probe_for_torch_loads_nothing_of_gpudocs() {
    let m = Machine::h200s(1);
    // transformers and accelerate look for torch this way before (and often without) importing it.
    let script = write(
        &m,
        "probe.py",
        r#"
import importlib.util, sys
before = set(sys.modules)
spec = importlib.util.find_spec("torch")
print(type(spec.loader).__name__, sorted(set(sys.modules) - before))
"#,
    );
    let (b, g) = (bare(&script, &[]), under(&m, &[], &script, &[]));
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(
        String::from_utf8_lossy(&g.stdout),
        String::from_utf8_lossy(&b.stdout)
    );
    assert!(String::from_utf8_lossy(&b.stdout).starts_with("SourceFileLoader []"));
}

#[test]
fn a_chaining_sitecustomize_runs_once_and_so_does_the_one_it_chains_to() {
    let m = Machine::h200s(1);
    let marker = m.path("marker");
    // New Relic's bootstrap: runs the next sitecustomize on sys.path, its own folder left out.
    let chaining = format!(
        r#"
import os, sys
from importlib.machinery import PathFinder
open({marker:?}, "a").write("chaining ")
here = os.path.dirname(__file__)
path = [p for p in sys.path if p != here]
spec = PathFinder.find_spec("sitecustomize", path=path)
if spec is not None:
    spec.loader.load_module("sitecustomize")
"#,
        marker = marker.to_str().unwrap()
    );
    let (first, second) = (m.path("chaining"), m.path("original"));
    for (dir, text) in [
        (&first, chaining),
        (
            &second,
            format!(
                "open({:?}, 'a').write('original ')\n",
                marker.to_str().unwrap()
            ),
        ),
    ] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("sitecustomize.py"), text).unwrap();
    }
    let path = format!(
        "{}:{}:{}",
        first.display(),
        second.display(),
        fake_torch().display()
    );
    let script = write(&m, "chain.py", &one_step(""));
    let env = [("PYTHONPATH", path.as_str())];
    let b = Command::new("python3")
        .envs(env)
        .arg(&script)
        .output()
        .unwrap();
    let bare_marker = std::fs::read_to_string(&marker).unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(bare_marker, "chaining original ");
    let g = m
        .gpudoc()
        .envs(env)
        .args(["run", "-q", "--json"])
        .arg(m.path("r.json"))
        .args(["--", "python3"])
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(g.status.code(), b.status.code(), "{}", text(&g));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), bare_marker);
    assert_eq!(
        String::from_utf8_lossy(&g.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    assert_eq!(steps_total(&m), 1);
}

#[test]
fn reloading_torch_installs_the_hooks_once() {
    let m = Machine::h200s(1);
    let script = write(
        &m,
        "reload.py",
        &(one_step("import importlib")
            + "importlib.reload(torch)\nfor _ in range(4):\n    opt.step()\nprint(len(torch.optim.optimizer._post_hooks))\n"),
    );
    let g = under(&m, &[], &script, &[]);
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(String::from_utf8_lossy(&g.stdout), "1\n");
    assert_eq!(steps_total(&m), 5);
}

#[test]
fn what_a_program_sees_of_the_shim_is_what_docs_framework_lists() {
    let m = Machine::h200s(1);
    // Everything of the import system and torch's C functions a program might look at.
    let script = write(
        &m,
        "traces.py",
        &(one_step("import sys\nbefore = set(sys.modules)")
            + r#"
print("sitecustomize" in sys.modules, hasattr(sys, "_gpudoc_shim"))
print([type(f).__name__ for f in sys.meta_path])
print([p for p in sys.path if "gpudoc" in p], [p for p in sys.path_importer_cache if "gpudoc" in p])
print(sorted(m for m in set(sys.modules) - before if not m.startswith("torch")))
for name in ("_cuda_memoryStats", "_cuda_resetPeakMemoryStats", "_cuda_record_memory_history"):
    f = getattr(torch._C, name)
    print(name, f.__module__, f.__name__, f.__qualname__, f.__doc__)
f, m = torch.nn.Module.train, torch.nn.Module()
print("train", f.__module__, f.__name__, f.__qualname__, f.__doc__, m.train() is m, m.eval().training)
import inspect
print("signature", inspect.signature(f))
# What is read of the function itself, not of what it wraps: torch's parameters, no __wrapped__.
print("own", inspect.signature(f, follow_wrapped=False), hasattr(f, "__wrapped__"), f.__defaults__, f.__kwdefaults__, f.__annotations__)
"#),
    );
    let (b, g) = (bare(&script, &[]), under(&m, &[], &script, &[]));
    assert!(b.status.success() && g.status.success(), "{}", text(&g));
    // Of the shim's modules only its hooks' (Dynamo finds a traced function's globals there), its
    // registry of changes (`gpudoc.patches()` reads it there) and its loader and writer (the hooks' module
    // finds it there) are in sys.modules; the standard ones it uses may be.
    let lines = |o: &Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(String::from)
            .collect()
    };
    let (bl, gl) = (lines(&b), lines(&g));
    assert_eq!(
        [gl[0].clone(), without_finder(&gl[1]), gl[2].clone()],
        bl[..3],
        "sys.modules, sys.meta_path (but the finder that waits for the other frameworks), sys.path"
    );
    let ours: Vec<&str> = gl[3].split('\'').filter(|m| m.contains("gpudoc")).collect();
    assert_eq!(
        ours,
        [
            "gpudoc._shim.patch",
            "gpudoc._shim.pipe",
            "gpudoc._shim.torch"
        ],
        "{}",
        gl[3]
    );
    assert_eq!(
        gl[4..],
        bl[4..],
        "torch._C's functions and Module.train look like torch's own"
    );
}

#[test]
fn reading_peaks_while_a_record_keeps_them_never_fails() {
    let m = Machine::h200s(1);
    // One thread reads the program's peaks while another resets them and the step hook's record keeps
    // what the reset erased (its function, called directly, many times).
    let script = write(
        &m,
        "race.py",
        &(one_step("import sys, threading\nsys.setswitchinterval(1e-6)")
            + r#"
keep = torch.optim.optimizer._post_hooks[0].__globals__["_keep"]
stats = torch._C._cuda_memoryStats(0)
errors = []
def read():
    for _ in range(30000):
        try:
            torch.cuda.max_memory_allocated(0)
        except Exception as e:
            errors.append(e)
t = threading.Thread(target=read)
t.start()
while t.is_alive():
    torch.cuda.reset_peak_memory_stats(0)
    keep(0, stats)
print(len(errors), set(map(repr, errors[:3])))
"#),
    );
    let g = under(&m, &[], &script, &[]);
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(String::from_utf8_lossy(&g.stdout), "0 set()\n");
}

#[test]
fn coverage_measures_the_program_and_never_the_shim() {
    let m = Machine::h200s(1);
    write(&m, "cov.py", &one_step(""));
    let g = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .current_dir(m.dir.path())
        .args(["run", "-q", "--json"])
        .arg(m.path("r.json"))
        .arg("--")
        .arg(common::python_with_packages())
        .args(["-m", "coverage", "run", "cov.py"])
        .output()
        .unwrap();
    assert!(
        g.status.success(),
        "coverage is missing? .ci/deps installs it: {}",
        text(&g)
    );
    assert_eq!(steps_total(&m), 1);
    // After the run: the report reads every file it measured, and none of them is gpudoc's.
    let report = Command::new(common::python_with_packages())
        .current_dir(m.dir.path())
        .args(["-m", "coverage", "report"])
        .output()
        .unwrap();
    let out = text(&report);
    assert!(report.status.success(), "{out}");
    assert!(out.contains("cov.py"), "{out}");
    assert!(
        !out.contains("_gpudoc") && !out.contains("sitecustomize"),
        "{out}"
    );
}

#[test]
fn closed_standard_descriptors_stay_the_programs() {
    let m = Machine::h200s(1);
    let script = write(
        &m,
        "closed.py",
        &(one_step("import os, sys")
            + &format!(
                r#"
try:
    os.write(1, b"into fd 1\n")
    wrote = "wrote"
except OSError as e:
    wrote = "errno %d" % e.errno
sys.stderr.write("%s, next file %d\n" % (wrote, open({:?}).fileno()))
"#,
                m.path("closed.py")
            )),
    );
    let sh = format!("exec python3 {} <&- >&-", script.display());
    let b = Command::new("sh")
        .env("PYTHONPATH", fake_torch())
        .args(["-c", &sh])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&b.stderr), "errno 9, next file 0\n");
    let g = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(["run", "-q", "--json"])
        .arg(m.path("r.json"))
        .args(["--", "sh", "-c", &sh])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&g.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    assert_eq!(steps_total(&m), 1);
}

#[test]
fn sigpipe_held_off_by_the_program_never_kills_it_when_gpudoc_is_gone() {
    let m = Machine::h200s(1);
    let done = m.path("done");
    let trainer = write(
        &m,
        "held.py",
        &(one_step(
            "import signal, time\nsignal.signal(signal.SIGPIPE, signal.SIG_DFL)\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})",
        ) + &format!(
            r#"
for i in range(40):
    opt.step()
    time.sleep(0.05)
print("pending at the end:", sorted(signal.sigpending()))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGPIPE}})
open({done:?}, "w").write("finished")
"#
        )),
    );
    // The trainer steps on in the background after the command (and gpudoc) have ended; its output
    // goes to a file, so gpudoc does not wait for it.
    let log = m.path("held.log");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(["run", "-q", "--", "sh", "-c"])
        .arg(format!(
            "python3 {} >{} 2>&1 & sleep 0.4",
            trainer.display(),
            log.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for _ in 0..100 {
        if done.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read_to_string(&done).unwrap_or_default(),
        "finished",
        "killed by SIGPIPE once it let it through: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn a_compiled_optimizer_step_traces_nothing_of_the_shim() {
    let m = Machine::h200s(1);
    // The step compiled with Dynamo (the fake's stand-in): its graph breaks and warnings are the
    // program's own; the shim's hook is folded away while Dynamo traces, as `is_compiling()` is.
    let script = write(
        &m,
        "compiled.py",
        &(one_step("")
            + r#"
step = torch.compile(opt.step, backend="eager")
for _ in range(5):
    step()
print(torch.compiler.graph_breaks())
"#),
    );
    let (b, g) = (bare(&script, &[]), under(&m, &[], &script, &[]));
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(text(&g), text(&b));
    assert_eq!(String::from_utf8_lossy(&b.stdout), "0\n");
    // The eager step before is counted, and the compiled ones too: the count is all the traced hook
    // leaves, which Dynamo replays at each run (docs/framework.md).
    assert_eq!(steps_total(&m), 6);
}

/// A program that runs a fake model forward without an optimizer, after `prelude`, then `body`.
fn forwards(prelude: &str, body: &str) -> String {
    format!(
        "{prelude}\nimport copy, gc, pickle, torch\ntorch.cuda.init()\nnet = torch.nn.Sequential(torch.nn.Linear(1 << 20), torch.nn.GELU())\nx = torch.empty(1 << 20)\n{body}\n"
    )
}

#[test]
fn the_forward_clock_leaves_the_model_as_the_program_made_it() {
    let m = Machine::h200s(1);
    // While the clock runs on `net` (no optimizer step yet): what copies and pickles of it carry, the
    // global hooks once its first call returned, an error raised in its forward, a compiled model's
    // graph breaks, and `net` dropped: its weight is freed at once (the clock never keeps it alive).
    let script = write(
        &m,
        "forwards.py",
        &forwards(
            "",
            r#"
class Net(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w = torch.empty(1 << 20)
        self.body = torch.nn.Linear(1 << 20)
    def forward(self, x):
        if x is None:
            raise ValueError("boom")
        return self.body(x)
net = Net()
with torch.no_grad():
    for _ in range(3):
        net(x)
print(len(torch.nn.modules.module._global_forward_hooks))
print(copy.deepcopy(net)._compiled_call_impl, pickle.loads(pickle.dumps(net))._compiled_call_impl)
print(sorted(copy.deepcopy(net).__dict__))
try:
    net(None)
except ValueError as e:
    print(repr(e))
compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(1 << 20)))
for _ in range(3):
    compiled(x)
print(torch.compiler.graph_breaks())
gc.disable()
before = torch.cuda.memory_allocated()
del net
print(before - torch.cuda.memory_allocated())
"#,
        ),
    );
    let (b, g) = (bare(&script, &[]), under(&m, &[], &script, &[]));
    assert!(b.status.success(), "{}", text(&b));
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(text(&g), text(&b));
    assert!(text(&b).ends_with("0\n1048576\n"), "{}", text(&b));
}

#[test]
fn the_forward_clock_stops_where_it_would_cost_at_the_first_step_and_without_hunts() {
    let m = Machine::h200s(1);
    // Forward calls microseconds apart (a model that allocates nothing): the wrapper's own call would be
    // over budget, so the clock gives the model's class back (no `__call__` of its own again) without
    // any optimizer step.
    let script = write(
        &m,
        "fast.py",
        &forwards(
            "",
            r#"
class Same(torch.nn.Module):
    def forward(self, x):
        return x
net = Same()
for _ in range(2000):
    net(x)
print("__call__" in vars(Same))
"#,
        ),
    );
    let (b, g) = (bare(&script, &[]), under(&m, &[], &script, &[]));
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(text(&g), text(&b));
    assert_eq!(String::from_utf8_lossy(&b.stdout), "False\n");
    // --hunt-leaks=off: the clock never takes the model (seen while it would be running).
    let script = write(
        &m,
        "off.py",
        &forwards(
            "",
            r#"
import time
for _ in range(3):
    net(x)
    time.sleep(0.01)
print("__call__" in vars(type(net)))
torch.optim.SGD().step()
print("__call__" in vars(type(net)), net._compiled_call_impl, "_compiled_call_impl" in net.__dict__)
"#,
        ),
    );
    let g = under(&m, &["--hunt-leaks=off"], &script, &[]);
    assert!(g.status.success(), "{}", text(&g));
    assert_eq!(
        String::from_utf8_lossy(&g.stdout),
        "False\nFalse None True\n"
    );
    // By default the clock runs (else the line above checks nothing), on the model's class; from the
    // first optimizer step on it only counts the model's calls (for an OOM's phase), still on the class;
    // the model itself never changed.
    let g = under(&m, &[], &script, &[]);
    assert_eq!(String::from_utf8_lossy(&g.stdout), "True\nTrue None True\n");
}

#[test]
fn the_shims_modules_are_compiled_at_import_torch_even_without_bytecode_writing() {
    let m = Machine::h200s(1);
    // PYTHONDONTWRITEBYTECODE is about the program's files: the shim's own folder gets the bytecode of
    // every module of the shim's at `import torch`, so the step that first loads the hunt's or the
    // where-walk's reads it instead of compiling it (17 ms of a step).
    let script = write(&m, "imports.py", &one_step(""));
    let g = under(
        &m,
        &[],
        &script,
        &[
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("XDG_CACHE_HOME", m.path("cache").to_str().unwrap()),
        ],
    );
    assert!(g.status.success(), "{}", text(&g));
    let shim = std::fs::read_dir(m.path("cache/gpudoc"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("shim-")
        })
        .expect("the shim's folder in the cache");
    let mut compiled: Vec<String> = std::fs::read_dir(shim.join("__pycache__"))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .split('.')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    compiled.sort();
    assert_eq!(
        compiled,
        [
            "_gpudoc_hunt",
            "_gpudoc_patch",
            "_gpudoc_pipe",
            "_gpudoc_site",
            "_gpudoc_torch",
            "_gpudoc_torch_cells",
            "_gpudoc_torch_clock",
            "_gpudoc_torch_events",
            "_gpudoc_torch_leaks",
            "_gpudoc_torch_notebook",
            "_gpudoc_torch_peaks",
            "_gpudoc_torch_phase",
            "_gpudoc_torch_pipe",
            "_gpudoc_torch_start",
            "_gpudoc_torch_steps",
            "_gpudoc_where",
            "sitecustomize"
        ]
    );
    // The program's own folder: no bytecode, as asked.
    assert!(!m.path("__pycache__").exists());
}

/// A printed list of `sys.meta_path`'s classes without gpudoc's finder (it stays after `import torch`,
/// waiting for the other frameworks: docs/framework.md).
fn without_finder(printed: &str) -> String {
    printed.replace("'GpudocFinder', ", "")
}
