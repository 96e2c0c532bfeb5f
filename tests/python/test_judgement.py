"""The held-out judgement's checker (tests/gpu/judgement.py `check`, run on a GPU by tests/gpu/judgement.sh):
each expectation fails a report that tells the story an expert would not (the H100's recordings of other
programs, judged as if they were these), and passes the report an expert would write."""
import copy
import importlib.util
import json
import os

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("judgement", os.path.join(ROOT, "tests/gpu/judgement.py"))
judgement = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(judgement)


def recorded(name):
    with open(os.path.join(ROOT, "fixtures/phases/h100", name + ".report.json")) as f:
        return json.load(f)


def bad(name, report, stdout=None, bare=None):
    return [what for ok, what in judgement.judge(name, report, stdout, bare) if not ok]


def test_a_backward_oom_told_of_an_optimizer_step_is_bad():
    # bw_oom's story (in backward, "other tensors", advice on the batch and autocast) is wrong for an OOM
    # in Adam's first step.
    got = bad("adam_first_step", recorded("bw_oom"))
    assert any(w.startswith("oom.pass is optimizer") for w in got), got
    assert any(w.startswith("oom.largest_part is optimizer_state") for w in got), got
    assert any(w.startswith("no advice /batch/") for w in got), got
    assert any(w.startswith("no advice /autocast") for w in got), got


def test_the_story_an_expert_would_tell_of_adams_first_step_passes():
    r = copy.deepcopy(recorded("bw_oom"))
    story = r["diagnoses"][0]
    story["facts"].update({"oom.pass": "optimizer", "oom.steps": 0, "oom.largest_part": "optimizer_state"})
    story["message"] = "GPU 0: the job ran out of memory in its optimizer step, before its first step ended."
    story["details"] = ["77.98 GiB allocated then: optimizer state 40 GiB (51%)"]
    story["advice"] = ["The optimizer's state held the most: shard it (FSDP, ZeRO 1), or an 8-bit optimizer."]
    story["parts"] = []
    r["diagnoses"] = [story]
    assert bad("adam_first_step", r) == []


def test_kept_micro_batch_graphs_told_as_an_evaluation_are_bad():
    # val_keep's story (an evaluation, advice inference_mode) is the wrong remedy for gradient accumulation
    # whose forward calls wait for one backward.
    got = bad("accum_graphs", recorded("val_keep"))
    assert any(w.startswith("no advice /inference_mode|no_grad/") for w in got), got
    assert any(w.startswith(r"nothing says /\bevaluation\b/") for w in got), got
    assert any(w.startswith("oom.phase is training_step") for w in got), got


def test_a_load_told_as_steady_growth_is_bad_and_a_quiet_one_passes():
    r = recorded("infer_cache")  # steady-growth on a program that ended by itself
    got = bad("slow_load", r)
    assert any("no other warn/error diagnosis (extra: steady-growth)" in w for w in got), got
    assert any(w.startswith(r"nothing says /\bleak/") or w.startswith("nothing says /grows steadily/")
               for w in got), got
    quiet = copy.deepcopy(r)
    quiet["diagnoses"] = []
    assert bad("slow_load", quiet) == []
    stopped = copy.deepcopy(quiet)
    stopped["exit"].update({"code": 123, "killed_by_gpudoc": True})
    got = bad("slow_load", stopped)
    assert any(w.startswith("exit code 0") for w in got) and any(w.startswith("not ended") for w in got), got


def test_a_result_unlike_the_bare_runs_is_bad():
    quiet = copy.deepcopy(recorded("infer_cache"))
    quiet["diagnoses"] = []
    same = {"what": "ckpt_train", "loss": "0x1.8p-3"}
    assert bad("ckpt_train", quiet, same, dict(same)) == []
    got = bad("ckpt_train", quiet, same, {"what": "ckpt_train", "loss": "0x1.9p-3"})
    assert len(got) == 1 and got[0].startswith("its result is the bare run's"), got
    assert bad("ckpt_train", quiet, None, None)  # a run that printed nothing is no pass


def test_check_counts_and_fails_on_a_missing_report(tmp_path, capsys):
    r = copy.deepcopy(recorded("infer_cache"))
    r["diagnoses"] = []
    (tmp_path / "prefetch_stream.report.json").write_text(json.dumps(r))
    assert judgement.check(str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "ok  prefetch_stream: exit is success" in out
    assert "BAD accum_graphs: no report" in out
    n = len(judgement.judge("prefetch_stream", r))
    assert out.splitlines()[-1] == "judgement: %d ok, %d BAD" % (n, len(judgement.EXPECT) - 1)
