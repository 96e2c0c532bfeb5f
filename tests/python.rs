//! The Python side's own unit tests (`tests/python/`, pytest), run by `cargo test` so that the README's one
//! test command covers both languages. They run in `target/py-venv`, the environment `.ci/deps` makes with
//! real PyTorch (its PyPI wheel, used on the CPU: autograd graphs, saved tensors, checkpointing and copies of
//! modules are what the shim must never change), IPython and pytest.
//!
//! Two pytest processes, one per core (libtest runs the two tests side by side): the slowest files in one,
//! every other file of the folder in the other, so a new file is never left out. One process took the
//! whole folder's time on one core while the other waited (each process imports torch once).

mod common;

use std::path::Path;
use std::process::Command;

/// The slowest files (a notebook's cells, Dynamo's compile): about half of the folder's time.
const SLOWEST: [&str; 2] = [
    "tests/python/test_notebook_cells.py",
    "tests/python/test_shim_compiled.py",
];

#[test]
fn the_slowest_python_unit_tests_pass() {
    pytest(&SLOWEST);
}

#[test]
fn every_other_python_unit_test_passes() {
    let mut args = vec!["tests/python"];
    for f in SLOWEST {
        args.extend(["--ignore", f]);
    }
    pytest(&args);
}

/// `pytest -q ARGS` from the repository's root; fails with pytest's output unless every test passed
/// (pytest fails too when a named file is missing or no test ran).
fn pytest(args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run .ci/deps first (it installs PyTorch, IPython and pytest there)",
        python.display()
    );
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(args)
        .current_dir(root)
        // The package from the source tree, never an installed copy; no .pyc files left in it.
        .env("PYTHONPATH", root.join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // The fake libnvidia-ml.so for the tests of gpudoc's own NVML reader (tests/python/conftest.py).
        .env("GPUDOC_TEST_FAKE_NVML", common::fake_lib())
        // Not under a gpudoc run of its own: the tests load the shim themselves.
        .env_remove("GPUDOC_TORCH")
        .output()
        .expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest {args:?} failed:\n{text}");
}
