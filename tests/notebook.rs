//! `%load_ext gpudoc` in a real Jupyter kernel: notebooks executed by nbclient and ipykernel (.ci/deps puts
//! them in target/test-venv), with the fake torch and the fake NVML, the package from the source tree and
//! this build's binary on PATH; each test asserts on the cells' outputs as a user reads them.

mod common;

use common::{Machine, fake_torch, python_with_packages};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One executed cell: what it printed, the error it raised ("Name: value"), the HTML it displayed, its
/// Out (text/plain).
#[derive(Debug)]
struct Cell {
    text: String,
    error: Option<String>,
    html: Option<String>,
    result: Option<String>,
}

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// The command that runs `cells` as a notebook in a fresh kernel on machine `m`.
fn notebook(m: &Machine, cells: &[&str]) -> Command {
    let cells_file = m.path("cells.json");
    std::fs::write(&cells_file, serde_json::to_vec(cells).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/notebook.py");
    let bin = common::gpudoc_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = m.shell(r#"exec "$0" "$1" < "$2""#);
    c.arg(python_with_packages())
        .arg(script)
        .arg(&cells_file)
        .env("PATH", path)
        .env(
            "PYTHONPATH",
            format!("{}:{}", fake_torch().display(), python_dir().display()),
        )
        // The kernel's files and IPython's profile are the test's: no user's startup file runs.
        .env("JUPYTER_RUNTIME_DIR", m.path("jupyter"))
        .env("IPYTHONDIR", m.path("ipython"))
        .env("JUPYTER_PLATFORM_DIRS", "1")
        .current_dir(m.dir.path());
    c
}

/// The cells' outputs, from the runner's JSON lines.
fn cells_of(stdout: &[u8]) -> Vec<Cell> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| Cell {
            text: v["text"].as_str().unwrap_or("").to_string(),
            error: v["error"].as_str().map(String::from),
            html: v["html"].as_str().map(String::from),
            result: v["result"].as_str().map(String::from),
        })
        .collect()
}

fn run(m: &Machine, cells: &[&str]) -> Vec<Cell> {
    let out = notebook(m, cells).output().unwrap();
    let got = cells_of(&out.stdout);
    assert_eq!(
        got.len(),
        cells.len(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    got
}

#[test]
fn after_each_cell_the_notebook_says_what_changed_and_what_holds_it() {
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "%load_ext gpudoc\nimport torch\ntorch.cuda.init()\nouts = []",
            "kept = torch.empty(2 << 30)",
            "n = 1 + 1",
            "big = torch.empty(5 << 30)\ndel big",
            "torch.empty(1 << 30)",
            "outs.append(torch.empty(256 << 20))",
            "outs.append(torch.empty(256 << 20))",
            "outs.append(torch.empty(256 << 20))",
            "print(torch.cuda.max_memory_allocated() >> 20)",
            "%%gpudoc\ny = torch.empty(3 << 30)\ndel y",
        ],
    );
    for c in &cells {
        assert_eq!(c.error, None, "{c:?}");
    }
    // One line for a cell whose memory changed: PyTorch's view, the peak inside it, NVML's, the time.
    let line = cells[1].text.lines().next().unwrap();
    assert!(
        line.starts_with("gpudoc: cell 2: allocated +2.00 GiB (2.00 GiB) · reserved +2.00 GiB"),
        "{line}"
    );
    assert!(
        line.contains("peak 2.00 GiB") && line.contains("process +2.00 GiB (2.49 GiB, NVML)"),
        "{line}"
    );
    // What holds it, with the fix.
    assert!(
        cells[1]
            .text
            .contains("`kept` holds 2.00 GiB (del kept when done with it)"),
        "{}",
        cells[1].text
    );
    // Nothing at all when nothing changed.
    assert_eq!(cells[2].text, "");
    // A peak inside the cell that left nothing behind.
    assert!(cells[3].text.contains("peak 7.00 GiB"), "{}", cells[3].text);
    assert!(!cells[3].text.contains("holds"), "{}", cells[3].text);
    // The output cache keeps what a cell displayed.
    assert!(
        cells[4]
            .text
            .contains("the output cache holds 1.00 GiB (Out[5], _): %gpudoc free drops it"),
        "{}",
        cells[4].text
    );
    // The same cell, growing at each run: named by the engine's rule.
    assert!(!cells[6].text.contains("[cell-leak]"), "{}", cells[6].text);
    let leak = &cells[7].text;
    assert!(leak.contains("[cell-leak]"), "{leak}");
    assert!(
        leak.contains(
            "the cell `outs.append(torch.empty(256 << 20))` left 256.00 MiB more allocated at each of its last 3 runs (In [6], [7] and [8]"
        ),
        "{leak}"
    );
    // The program's own peak is its own: gpudoc's resets at each cell never show.
    assert_eq!(
        cells[8].text.lines().next(),
        Some("7168"),
        "kept and big: 7 GiB"
    );
    // %%gpudoc: the engine's report of the cell, and its page inline.
    let full = &cells[9];
    assert!(
        full.text
            .contains("gpudoc: notebook ran cell 10 (`y = torch.empty(3 << 30)`)"),
        "{}",
        full.text
    );
    assert!(
        full.text.contains("GPU 0 NVIDIA H200: job peak"),
        "{}",
        full.text
    );
    let html = full.html.as_deref().unwrap_or("");
    assert!(
        html.starts_with("<div><iframe srcdoc=\"&lt;!DOCTYPE html&gt;"),
        "{html:.200}"
    );
}

#[test]
fn a_gpudoc_cell_runs_in_a_kernel_as_any_cell_does() {
    // ipykernel runs a cell with top-level await on its own event loop; %%gpudoc's body is that cell.
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "%load_ext gpudoc\nimport torch\ntorch.cuda.init()",
            "%%gpudoc\nimport asyncio\nawait asyncio.sleep(0)\nx = torch.empty(1 << 30)\n41 + 1",
        ],
    );
    let full = &cells[1];
    assert_eq!(
        (full.error.as_deref(), full.result.as_deref()),
        (None, Some("42")),
        "{}",
        full.text
    );
    assert!(
        full.text
            .contains("gpudoc: notebook ran cell 2 (`import asyncio`)"),
        "{}",
        full.text
    );
}

#[test]
fn the_cell_that_loads_the_extension_gets_its_line_too() {
    // `%load_ext gpudoc` at the top of the cell that builds the model (as most notebooks start): the
    // cell's start went by before the extension's callbacks came; the cell counts from the load.
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &["%load_ext gpudoc\nimport torch\ntorch.cuda.init()\nmodel = torch.empty(2 << 30)"],
    );
    let line = cells[0].text.lines().next().unwrap_or("");
    assert!(
        line.starts_with("gpudoc: cell 1: allocated +2.00 GiB (2.00 GiB)"),
        "{:?}",
        cells[0]
    );
    // torch already in use before the load: what the cell allocated after it, not what came before.
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "import torch\ntorch.cuda.init()\nearlier = torch.empty(1 << 30)",
            "%load_ext gpudoc\nmodel = torch.empty(2 << 30)",
            "more = torch.empty(1 << 30)",
        ],
    );
    assert_eq!(cells[0].text, "");
    let line = cells[1].text.lines().next().unwrap_or("");
    assert!(
        line.starts_with("gpudoc: cell 2: allocated +2.00 GiB (3.00 GiB)"),
        "{:?}",
        cells[1]
    );
    assert!(
        cells[2]
            .text
            .starts_with("gpudoc: cell 3: allocated +1.00 GiB (4.00 GiB)"),
        "{:?}",
        cells[2]
    );
}

#[test]
fn loading_the_extension_again_after_unloading_it_counts_the_loading_cell_from_the_load() {
    // The unloading cell's end went by unseen: the cell that loads it again is counted from its load,
    // not from the unloading cell's start, and with PyTorch's part.
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "%load_ext gpudoc\nimport torch\ntorch.cuda.init()",
            "%unload_ext gpudoc\na = torch.empty(1 << 30)",
            "b = torch.empty(1 << 30)",
            "%load_ext gpudoc\nc = torch.empty(1 << 30)",
        ],
    );
    assert_eq!((&cells[1].text, &cells[2].text), (&"".into(), &"".into()));
    assert!(
        cells[3]
            .text
            .starts_with("gpudoc: cell 4: allocated +1.00 GiB (3.00 GiB)"),
        "{:?}",
        cells[3]
    );
}

#[test]
fn an_oom_in_a_cell_is_explained_and_gpudoc_free_gives_its_memory_back() {
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "%load_ext gpudoc\nimport torch\ntorch.cuda.init()\nkept = torch.empty(2 << 30)",
            "def forward(n):\n    h = torch.empty(100 << 30)\n    torch.cuda._oom(n, free=None)\nforward(64 << 30)",
            "%gpudoc",
            "torch.empty(1 << 30)",
            "%gpudoc free",
            "print(torch.cuda.memory_allocated() >> 30, kept.nbytes() >> 30)",
        ],
    );
    let oom = &cells[1];
    assert!(
        oom.error
            .as_deref()
            .is_some_and(|e| e.starts_with("OutOfMemoryError: CUDA out of memory")),
        "{oom:?}"
    );
    // The engine's explanation, as gpudoc run gives it: the cell, the cause, the rule, what held it.
    let text = &oom.text;
    assert!(
        text.lines().any(|l| l
            .starts_with("gpudoc: notebook ran out of GPU memory on GPU 0 after")
            && l.ends_with(" in cell 2 (`def forward(n):`)")),
        "{text}"
    );
    assert!(
        text.contains("cause: the job's own growth")
            && text.contains(
                "Out of memory loading the model, or running it without training [oom-self-growth]"
            ),
        "{text}"
    );
    assert!(
        text.contains(
            "held by local `h` (cell 2, in forward) — at the OOM: its tensor holds 100.00 GiB"
        ),
        "{text}"
    );
    // What still holds its memory after it: the traceback's frames.
    assert!(
        text.contains(
            "the traceback of the OOM in cell 2 still holds 100.00 GiB: the frames of forward(); run %gpudoc free to drop it"
        ),
        "{text}"
    );
    // %gpudoc: the state, everything that holds memory.
    let status = &cells[2].text;
    assert!(
        status.starts_with("gpudoc: cuda:0 allocated 102.00 GiB, reserved 102.00 GiB"),
        "{status}"
    );
    assert!(
        status.contains("`kept` holds 2.00 GiB") && status.contains("the traceback of the OOM"),
        "{status}"
    );
    // %gpudoc free: the traceback and the output cache go, the user's variable stays.
    let free = &cells[4].text;
    assert!(
        free.starts_with(
            "gpudoc: dropped the last traceback's frames (100.00 GiB), Out[4], _ (1.00 GiB); PyTorch's cache gave back 101.00 GiB; now cuda:0 allocated 2.00 GiB, reserved 2.00 GiB"
        ),
        "{free}"
    );
    assert!(
        free.contains("the process holds 2.49 GiB (NVML), was 103.49 GiB"),
        "{free}"
    );
    assert_eq!(
        cells[5].text, "2 2\n",
        "kept is still there, and all that is"
    );
}

/// The H200's notebook: an OOM partway through a model's forward. The failed forward's activations are
/// saved by the autograd graph behind the last layer's output, which no Python name refers to; the
/// traceback's frames keep that output, so the traceback holds them all, and says so.
#[test]
fn an_oom_inside_a_forward_names_the_traceback_with_the_graph_behind_it() {
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "%load_ext gpudoc\nimport torch\ntorch.cuda.init()\n\
             class Boom(torch.nn.Module):\n    def forward(self, x):\n        torch.cuda._oom(16 << 30, free=None)\n\
             model = torch.nn.Sequential(*[torch.nn.Linear(16 << 30) for _ in range(6)], Boom())",
            "def run(n):\n    x = torch.empty(n)\n    return model(x)\nrun(16 << 30)",
            "%gpudoc",
            "%gpudoc free",
        ],
    );
    assert!(
        cells[1]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("OutOfMemoryError")),
        "{:?}",
        cells[1]
    );
    // The input (16 GiB) and the sixth layer's output (16 GiB) are the frames' locals; the first five
    // layers' outputs (80 GiB), only the graph's.
    let held = "the traceback of the OOM in cell 2 still holds 112.00 GiB (80.00 GiB of it in the autograd graphs behind its tensors): the frames of run(), forward()";
    assert!(cells[1].text.contains(held), "{}", cells[1].text);
    // NVML is read once, at the cell's end: what each process held then, no window before it.
    assert!(
        cells[1]
            .text
            .contains("  then (NVML, read once):\n    job   pid ")
            && !cells[1].text.contains("s before (NVML)"),
        "{}",
        cells[1].text
    );
    assert!(cells[2].text.contains(held), "{}", cells[2].text);
    assert!(
        cells[3]
            .text
            .starts_with("gpudoc: dropped the last traceback's frames (112.00 GiB)"),
        "{}",
        cells[3].text
    );
}

#[test]
fn the_extension_starts_no_thread_and_never_initialises_cuda() {
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "import threading\nbefore = set(threading.enumerate())",
            "%load_ext gpudoc\nimport torch",
            "x = [1] * 1000",
            "%gpudoc",
            "print(set(threading.enumerate()) - before, torch.cuda.is_initialized())",
        ],
    );
    // A kernel that never used the GPU keeps it untouched: no CUDA context (hundreds of MiB on every GPU
    // it would make) and no thread of gpudoc's, which a fork after CUDA would not survive.
    assert_eq!(cells[4].text, "set() False\n", "{cells:?}");
    assert_eq!(
        cells[3].text, "gpudoc: torch has no CUDA memory in this kernel yet\n",
        "{cells:?}"
    );
    assert!(cells[1..3].iter().all(|c| c.text.is_empty()), "{cells:?}");
}

#[test]
fn without_nvml_an_oom_in_an_ipython_cell_is_still_explained_in_its_cell() {
    // IPython in a terminal (no kernel) in a container without the driver's NVML: PyTorch's view alone.
    let m = Machine::h200s(1);
    let script = r#"
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for cell in ("%load_ext gpudoc\nimport torch\ntorch.cuda.init()",
             "def forward(n):\n    h = torch.empty(100 << 30)\n    torch.cuda._oom(n, free=None)\nforward(64 << 30)"):
    shell.run_cell(cell, store_history=True)
"#;
    let bin = common::gpudoc_bin();
    let out = Command::new(python_with_packages())
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", bin.parent().unwrap().display()),
        )
        .env(
            "PYTHONPATH",
            format!("{}:{}", fake_torch().display(), python_dir().display()),
        )
        .env("GPUDOC_NVML_LIB", "/nonexistent")
        .env("IPYTHONDIR", m.path("ipython"))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .current_dir(m.dir.path())
        .args(["-c", script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let headline = text
        .lines()
        .find(|l| l.starts_with("gpudoc: ipython ran out of GPU memory on GPU 0 after"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        headline.ends_with(" in cell 2 (`def forward(n):`)"),
        "{text}"
    );
    assert!(
        text.contains("held by local `h` (cell 2, in forward)"),
        "{text}"
    );
}

#[test]
fn a_compiled_optimizer_step_runs_in_a_notebook_with_the_extension() {
    let m = Machine::h200s(1);
    let cells = run(
        &m,
        &[
            "%load_ext gpudoc\nimport torch\nfrom torch.optim.optimizer import Optimizer\ntorch.cuda.init()\nopt = Optimizer()",
            "step = torch.compile(opt.step, backend=\"eager\")\nfor _ in range(3):\n    step()\nprint(\"stepped\", torch.compiler.graph_breaks())",
        ],
    );
    // Dynamo, tracing into the extension's step hook, finds its globals by importing their module's name.
    assert_eq!(cells[1].error, None, "{cells:?}");
    assert_eq!(cells[1].text, "stepped 0\n", "{cells:?}");
}

#[test]
fn an_oom_in_a_cell_after_training_cells_is_placed_after_their_steps() {
    // Also with the extension reloaded between them: what the earlier cells showed it is kept.
    for between in [None, Some("%reload_ext gpudoc")] {
        let m = Machine::h200s(1);
        let mut cells = vec![
            "%load_ext gpudoc\nimport torch\nfrom torch.optim.optimizer import Optimizer\ntorch.cuda.init()\nopt = Optimizer()",
            "w = torch.empty(4 << 30)\nfor _ in range(30):\n    opt.step()",
        ];
        cells.extend(between);
        cells.push("import time\ntime.sleep(1)\nouts = [torch.empty(8 << 30) for _ in range(12)]\ntorch.cuda._oom(64 << 30, free=None)");
        let cells = run(&m, &cells);
        let text = &cells.last().unwrap().text;
        // The steps ran a cell before, a second earlier: the engine still sees them, and the OOM came
        // after them. What ran then (no model call, no backward) tells no phase: none is named.
        assert!(
            text.contains("ran out of memory after optimizer step 30 "),
            "{between:?}: {text}"
        );
        assert!(
            text.contains("[oom-self-growth]")
                && !text.contains("without training")
                && !text.contains("while loading")
                && !text.contains("in an evaluation"),
            "{between:?}: {text}"
        );
    }
}

/// `cells` run as a notebook whose kernel is a process of a job of `gpudoc run --json`: each cell's
/// outputs, the run's report and gpudoc's stderr.
fn under_gpudoc_run(cells: &[&str]) -> (Vec<Cell>, Value, String) {
    let m = Machine::h200s(1);
    let json = m.path("report.json");
    let c = notebook(&m, cells);
    let args: Vec<_> = c.get_args().map(|a| a.to_os_string()).collect();
    let envs: Vec<_> = c
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
        .collect();
    let out = m
        .gpudoc()
        .envs(envs)
        .current_dir(m.dir.path())
        .args(["run", "--json"])
        .arg(&json)
        .args(["--", "bash"])
        .args(args)
        .output()
        .unwrap();
    let got = cells_of(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(got.len(), cells.len(), "{err}");
    (got, common::read_json(&json), err)
}

/// The numbers of the notebook cells a report's first process recorded, in order.
fn cell_numbers(r: &Value) -> Vec<u64> {
    r["torch"]["processes"][0]["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["n"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_kernel_under_gpudoc_run_reports_its_cells() {
    let (cells, r, err) = under_gpudoc_run(&[
        "import torch\ntorch.cuda.init()\nkept = torch.empty(2 << 30)",
        "x = torch.empty(30 << 30)\ndel x",
        "def forward(size, n):\n    h = torch.empty(size)\n    torch.cuda._oom(n, free=None)\nforward(100 << 30, 64 << 30)",
        "%load_ext gpudoc",
        "forward(1 << 30, 64 << 30)",
    ]);
    // The extension, loaded late, reads the cells through gpudoc run's shim, and its explanation of the
    // second OOM names the first one's traceback as what filled the GPU.
    let second = &cells[4].text;
    assert!(
        second.contains(
            "held by local `h` (cell 3, in forward, the last exception's traceback) — at the OOM: its tensor holds 100.00 GiB"
        ),
        "{second}"
    );
    let p = &r["torch"]["processes"][0];
    assert_eq!(cell_numbers(&r), vec![1, 2, 3, 4, 5], "{}", p["cells"]);
    assert_eq!(p["cells"][1]["peak_allocated_bytes"], 32u64 << 30);
    assert_eq!(p["cells"][2]["ok"], false);
    // gpudoc run's own summary places the peak and the OOMs in their cells: the last one's peak is the
    // highest, the first OOM's traceback still held then.
    assert!(
        err.contains(
            "allocated peaked at 103.00 GiB in cell 5 (`forward(1 << 30, 64 << 30)`); ran out of memory in cell 3, cell 5"
        ),
        "{err}"
    );
    assert!(err.contains("(cell 5) · device peak"), "{err}");
}

#[test]
fn a_capture_cell_gets_its_line_after_the_capture_under_its_own_number() {
    // %%capture runs its body as a cell of its own (IPython numbers it as the next cell): its memory is
    // the capture cell's, said after it, in the extension's line and in gpudoc run's report.
    let (cells, r, err) = under_gpudoc_run(&[
        "import torch\ntorch.cuda.init()\nk = torch.empty(1 << 30)",
        "%load_ext gpudoc",
        "%%capture cap\nm = torch.empty(2 << 30)",
        "print(repr(cap.stdout))",
        "n = torch.empty(1 << 30)",
    ]);
    assert!(
        cells[2]
            .text
            .starts_with("gpudoc: cell 3: allocated +2.00 GiB (3.00 GiB)"),
        "{cells:?}"
    );
    assert_eq!(cells[3].text, "''\n", "{cells:?}");
    assert!(
        cells[4]
            .text
            .starts_with("gpudoc: cell 5: allocated +1.00 GiB (4.00 GiB)"),
        "{cells:?}"
    );
    assert_eq!(cell_numbers(&r), vec![1, 2, 3, 4, 5], "{err}");
}
