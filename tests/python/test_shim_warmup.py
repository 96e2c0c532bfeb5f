"""Warm-up has one definition, src/torch/warmup.rs's `STEPS` (the parameter `warmup_steps` of
src/params.rs): gpudoc run tells the shim it, and the shim's own value (for a copy loaded without gpudoc
run, the notebook extension's) is the same."""
import os
import re

import pytest
from shim_env import HERE, ROOT

pytest.importorskip("torch")


def rust_warmup_steps():
    with open(os.path.join(ROOT, "src", "params.rs")) as f:
        return int(re.search(r'"warmup_steps",\s*(\d+),', f.read()).group(1))


class _Finder(object):
    busy = False


def test_gpudoc_run_tells_the_shim_how_many_steps_warm_up_is(shim):
    T = shim.torch
    told = "hunt=auto;peaks=reset;where=on;warmup=3;pipe=" + shim.pipe
    assert T.find_spec(_Finder(), "gpudoc_no_such_module", None, None, HERE, told) is None
    assert T.WARMUP_STEPS == 3
    # Without the word (an older gpudoc's setting), the shim keeps its own.
    T.WARMUP_STEPS = 10
    T.find_spec(_Finder(), "gpudoc_no_such_module", None, None, HERE, "hunt=auto;pipe=" + shim.pipe)
    assert T.WARMUP_STEPS == 10


def test_the_shims_own_warm_up_is_the_binarys(shim):
    assert shim.torch.WARMUP_STEPS == rust_warmup_steps()
