"""The notebook extension (`%load_ext gpudoc`) in an IPython shell: what a cell does is the cell's own, and
gpudoc's callbacks never take the user's place. Each test runs its cells in a Python of its own (the
fake torch, which has CUDA on a CPU, must not meet the real one of the other tests), with IPython from
the running environment."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The child's start: a shell, `cell(source)` runs a cell as a notebook does, and the extension is loaded
# with torch in use.
PRELUDE = """
import json, os, sys
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
import gpudoc.notebook

config = Config()
config.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=config)


def cell(source):
    return shell.run_cell(source, store_history=True)


def cell_records():
    doctor = gpudoc.notebook._DOCTORS[id(shell)]
    return [m for m in doctor.kept.messages if m.get("k") == "cell"]


# The holders' search (the shim's hunt module), counting the items it takes from containers.
def counting_items():
    hunt = gpudoc.notebook._DOCTORS[id(shell)].shim.api._hunt_module()
    taken, real = [0], hunt._next

    def counted(entry):
        taken[0] += 1
        return real(entry)

    hunt._next = counted
    return hunt, taken


cell("%load_ext gpudoc\\nimport torch\\ntorch.cuda.init()\\nkept = torch.empty(2 << 20)")
"""


def in_shell(tmp_path, script):
    """Runs `script` after PRELUDE; what it printed, and the JSON it printed last as `RESULT {...}`."""
    path = os.pathsep.join([os.path.join(ROOT, "python"), os.path.join(ROOT, "fixtures/fake_torch")])
    env = dict(os.environ, GPUDOC_NVML_LIB="/nonexistent", IPYTHONDIR=str(tmp_path / "ipython"),
               PYTHONPATH=path,
               PATH=os.pathsep.join([os.path.join(ROOT, "target/debug"), os.environ.get("PATH", "")]))
    env.pop("GPUDOC_TORCH", None)
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], env=env,
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    text = done.stdout.decode("utf-8", "replace")
    results = [line[7:] for line in text.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, text
    return text, json.loads(results[-1])


def test_a_gpudoc_cell_shows_its_last_expression_as_any_cell_does(tmp_path):
    text, got = in_shell(tmp_path, """
        r = cell("%%gpudoc\\nx = 41\\nx + 1")
        out = shell.user_ns["Out"].get(r.execution_count)
        print("RESULT " + json.dumps([repr(r.error_in_exec), r.result, out, r.execution_count]))
    """)
    assert got[:3] == ["None", 42, 42], text
    assert "Out[%d]: 42" % got[3] in text


def test_a_gpudoc_cell_may_await_at_top_level(tmp_path):
    text, got = in_shell(tmp_path, """
        r = cell("%%gpudoc\\nimport asyncio\\nawait asyncio.sleep(0)\\n'awaited'")
        print("RESULT " + json.dumps([repr(r.error_in_exec), r.result]))
    """)
    assert got == ["None", "awaited"], text


def test_a_gpudoc_cells_traceback_has_the_cells_frames_only(tmp_path):
    text, frames = in_shell(tmp_path, """
        r = cell("%%gpudoc\\ndef f():\\n    return 1 / 0\\nf()")
        assert isinstance(r.error_in_exec, ZeroDivisionError)
        frames, tb = [], sys.last_traceback
        while tb is not None:
            frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
        print("RESULT " + json.dumps(frames))
    """)
    here = os.path.join(ROOT, "python", "gpudoc")
    assert not [f for f, _ in frames if f.startswith(here)], frames
    # The cell's lines as the notebook numbers them: f() on line 4, the division on line 3.
    assert [n for f, n in frames if f == frames[-1][0]] == [4, 3], frames


def test_a_gpudoc_cell_starting_with_a_timed_line_is_named_after_it(tmp_path):
    text, got = in_shell(tmp_path, """
        cell("%%gpudoc\\n%time grown = torch.empty(2 << 20)\\nz = 2")
        print("RESULT " + json.dumps(cell_records()[-1]["src"]))
    """)
    assert got == "%time grown = torch.empty(2 << 20)", text


def test_a_gpudoc_cell_in_a_terminal_waits_for_the_blank_line_that_ends_it(tmp_path):
    # IPython's terminal asks whether the cell is complete at each Enter: as for any cell magic, not
    # before a blank line.
    text, got = in_shell(tmp_path, """
        check = shell.input_transformer_manager.check_complete
        print("RESULT " + json.dumps([check("%%gpudoc\\nx = 1\\n")[0], check("%%gpudoc\\nx = 1\\n\\n")[0]]))
    """)
    assert got == ["incomplete", "complete"], text


def test_an_interrupt_while_gpudoc_explains_an_oom_leaves_the_users_exception(tmp_path):
    # The engine interrupts the kernel as a user's press would, while gpudoc waits for it.
    engine = tmp_path / "gpudoc"
    engine.write_text("#!/bin/sh\nkill -INT $PPID\nexec sleep 10\n")
    engine.chmod(0o755)
    text, got = in_shell(tmp_path, """
        gpudoc.notebook._report.binary = lambda: %r
        r = cell("def forward(n):\\n    h = torch.empty(100 << 20)\\n    torch.cuda._oom(n, free=None)\\n"
                 "forward(64 << 30)")
        # %%tb and %%debug read these: the user's OOM, not an interrupt inside gpudoc.
        print("RESULT " + json.dumps([type(r.error_in_exec).__name__, sys.last_value is r.error_in_exec,
                                      sys.last_traceback is r.error_in_exec.__traceback__]))
    """ % str(engine))
    assert got == ["OutOfMemoryError", True, True], text
    assert "Error in callback" not in text and "KeyboardInterrupt" not in text, text


def test_an_interrupt_during_the_shims_own_cell_callbacks_leaves_the_users_exception(tmp_path):
    # gpudoc run's shim registers callbacks of its own in a kernel (here alone: the extension's are taken
    # off); an interrupt comes while one reads torch's statistics.
    text, got = in_shell(tmp_path, """
        doctor = gpudoc.notebook._DOCTORS[id(shell)]
        shim = doctor.shim.api

        def pressed():
            raise KeyboardInterrupt

        shim._in_use = pressed
        shell.events.unregister("pre_run_cell", doctor.pre)
        shell.events.unregister("post_run_cell", doctor.post)
        shim.CELL.hooked = False
        shim.watch_cells(shell)
        r = cell("1 / 0")
        print("RESULT " + json.dumps(sys.last_value is r.error_in_exec))
    """)
    assert got is True, text
    assert "Error in callback" not in text, text


OOM_IN_F = ("def f(n):\\n    notes = 'x'\\n    t = torch.empty(100 << 20)\\n"
            "    torch.cuda._oom(n, free=None)\\nf(64 << 30)")


def test_gpudoc_free_keeps_the_frames_of_a_traceback_the_user_saved(tmp_path):
    text, got = in_shell(tmp_path, """
        cell("%s")
        cell("import sys\\nsaved = sys.last_traceback")
        cell("%%gpudoc free")
        tb = shell.user_ns["saved"]
        while tb.tb_frame.f_code.co_name != "f":
            tb = tb.tb_next
        print("RESULT " + json.dumps(sorted(tb.tb_frame.f_locals)))
    """ % OOM_IN_F)
    assert got == ["n", "notes", "t"], text
    assert "the last traceback's frames are kept: `saved` holds it (del saved to drop them)" in text, text


def test_gpudoc_free_clears_the_frames_of_a_traceback_only_ipython_holds(tmp_path):
    text, got = in_shell(tmp_path, """
        r = cell("%s")
        tb = r.error_in_exec.__traceback__
        while tb.tb_frame.f_code.co_name != "f":
            tb = tb.tb_next
        frame = tb.tb_frame
        del r, tb
        cell("%%gpudoc free")
        print("RESULT " + json.dumps(sorted(frame.f_locals)))
    """ % OOM_IN_F)
    assert got == [], text
    assert "gpudoc: dropped the last traceback's frames (100.00 MiB)" in text, text


def test_the_holders_search_walks_a_large_dict_subclass_in_slices(tmp_path):
    # A slice whose time is up at its first look at the clock: it stops within a few dozen items, also in
    # a dict of its own with a million numbers (none of which it goes into, so none counted as a step).
    text, got = in_shell(tmp_path, """
        cell("class Table(dict):\\n    pass\\nbig = Table((i, i) for i in range(10 ** 6))")
        hunt, taken = counting_items()
        search = hunt.Search(sys.modules["torch"], 0, None, skip=())
        search.run(0.0)
        print("RESULT " + json.dumps([taken[0], search.done]))
    """)
    taken, done = got
    assert not done and taken < 1000, text


def test_a_cells_holders_are_found_without_walking_a_large_table_past_them(tmp_path):
    # Once every live tensor is found (`kept`, then `outs`), the million items of `big` are not walked:
    # the cell waits for its search as long as without the table.
    text, taken = in_shell(tmp_path, """
        cell("class Table(dict):\\n    pass\\nbig = Table((i, i) for i in range(10 ** 6))\\nouts = []")
        hunt, taken = counting_items()
        cell("outs.append(torch.empty(2 << 20))")
        print("RESULT " + json.dumps(taken[0]))
    """)
    assert "`outs` holds 2.00 MiB (del outs when done with it)" in text, text
    assert taken < 10000, text
