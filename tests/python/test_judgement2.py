"""The held-out judgement's second set (tests/gpu/judgement2.py, run on a GPU by tests/gpu/judgement2.sh),
judged by the first set's checker (judgement.py's `judge` and `check`, given EXPECT2): each expectation
passes the report an expert would write and fails one that gives a remedy that does not apply, on reports
gpudoc recorded on real GPUs (fixtures/runs, fixtures/oom/h200)."""
import copy
import importlib.util
import json
import os

import pytest
from conftest import ROOT

_spec = importlib.util.spec_from_file_location("judgement2", os.path.join(ROOT, "tests/gpu/judgement2.py"))
judgement2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(judgement2)
judgement = judgement2.judgement  # the first set's checker, as judgement2 loaded it


def recorded(path):
    with open(os.path.join(ROOT, "fixtures", path + ".report.json")) as f:
        return json.load(f)


def bad(name, report):
    return [what for ok, what in judgement.judge(name, report, expect=judgement2.EXPECT2) if not ok]


def test_every_program_has_an_expectation_of_known_keys_and_none_is_the_first_sets():
    assert set(judgement2.PROGRAMS2) == set(judgement2.EXPECT2)
    assert not set(judgement2.EXPECT2) & set(judgement.EXPECT)
    for name, want in judgement2.EXPECT2.items():
        assert set(want) <= judgement.EXPECT_KEYS, name
        assert want["why"] and want["exit"] in ("success", "gpu_oom"), name


def test_a_misspelt_expectation_key_is_an_error_not_a_silent_pass():
    table = {"detached_eval": dict(judgement2.EXPECT2["detached_eval"], advise=[r"never checked"])}
    with pytest.raises(ValueError, match="advise"):
        judgement.judge("detached_eval", recorded("runs/leftover"), expect=table)


def test_retry_advice_given_to_an_empty_cache_every_step_is_bad():
    # fixtures/runs/thrash: allocator-thrash on a job that calls empty_cache() every step, as the rule tells
    # it now. Advice to reduce the batch size or set expandable_segments is for retries at the GPU's edge:
    # not this job's (the rule gave it before its advice was bound to the retries).
    r = recorded("runs/thrash")
    assert bad("empty_cache_loop", r) == []
    told = copy.deepcopy(r)
    (d,) = told["diagnoses"]
    d["advice"].append("Retries mean the job is at the edge of the GPU's memory: reduce the batch size a "
                       "little, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
    got = bad("empty_cache_loop", told)
    said = sorted(w.split(" (")[0] for w in got)
    assert said == ["no advice /batch size/", "no advice /expandable_segments/"], got


def test_an_oom_at_the_cap_passes_and_told_as_a_full_gpu_is_bad():
    r = recorded("oom/h200/fraction_cap")
    assert bad("frac_cap", r) == []
    full = copy.deepcopy(r)
    (d,) = full["diagnoses"]
    d.update(rule="oom-self-growth",
             message="GPU 0: the job ran out of memory, having filled 99.2% of the GPU",
             advice=["Reduce the batch size; or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."])
    d["facts"]["oom.cause"] = "self_growth"
    got = bad("frac_cap", full)
    for want in ("oom-cap fires", "oom.cause is cap", "its advice says /set_per_process_memory_fraction/",
                 "no advice /expandable_segments/", "nothing says /filled 9"):
        assert any(w.startswith(want) for w in got), (want, got)


def test_a_leftover_evaluator_passes_and_silence_about_it_is_bad():
    r = recorded("runs/leftover")
    assert bad("detached_eval", r) == []
    quiet = copy.deepcopy(r)
    quiet["diagnoses"] = []
    got = bad("detached_eval", quiet)
    assert any(w.startswith("leftover-processes fires") for w in got), got
    assert any(w.startswith("its advice says /--kill-orphans") for w in got), got


def test_check_takes_the_second_table(tmp_path, capsys):
    (tmp_path / "detached_eval.report.json").write_text(json.dumps(recorded("runs/leftover")))
    with pytest.raises(SystemExit) as stop:
        judgement.main(["judgement2.py", "check", str(tmp_path)], judgement2.PROGRAMS2, judgement2.EXPECT2)
    assert stop.value.code == 1
    out = capsys.readouterr().out
    assert "ok  detached_eval: leftover-processes fires" in out
    assert "BAD frac_cap: no report" in out
    assert "accum_graphs" not in out  # the first set's programs are not this table's
    n = len(judgement.judge("detached_eval", recorded("runs/leftover"), expect=judgement2.EXPECT2))
    assert out.splitlines()[-1] == "judgement: %d ok, %d BAD" % (n, len(judgement2.EXPECT2) - 1)


def test_an_unknown_program_is_refused():
    with pytest.raises(SystemExit, match="unknown program accum_graphs"):
        judgement.main(["judgement2.py", "accum_graphs"], judgement2.PROGRAMS2, judgement2.EXPECT2)
