"""Looking for the program's models among its names is bounded (issue 42, item 6): an object with
millions of attributes made each measured step read them all (11 s at 6 million). Real torch; 250,000
attributes here (a million took 2 s to make, for nothing more: read whole, they are 250,000 looks)."""
import sys

import pytest


torch = pytest.importorskip("torch")


class Trainer(object):
    pass


def test_an_object_with_a_quarter_million_attributes_is_not_read_whole(shim):
    trainer = Trainer()
    trainer.model = torch.nn.Linear(2, 2)  # found: among the first attributes
    vars(trainer).update(("a%d" % i, i) for i in range(250000))  # as 250,000 setattr, in a third
    looks = [0]

    def profile(frame, event, arg):
        # Each name or attribute looked at is one call of Program's `look`.
        if event == "call" and frame.f_code.co_name == "look":
            looks[0] += 1

    sys.setprofile(profile)
    try:
        program = shim.where.Program(torch, shim.hunt)
    finally:
        sys.setprofile(None)
    assert [n for n, _ in program.roots] == ["trainer.model"]
    assert looks[0] < 100000
