"""The hooks a measured step puts on its autograd graph (a prehook on each module output's node, marking
where backward is) go through the registry as every other change of the shim's (issue 45, item 3): listed
by `gpudoc.patches()` while the step is measured, and taken back with the measure, so a graph the program
keeps for a later backward runs no code of gpudoc's then. Real torch on the CPU."""
import pytest


torch = pytest.importorskip("torch")


from nets import Net  # noqa: E402


def test_a_measured_steps_graph_hooks_are_listed_and_go_with_the_measure(shim, cuda, monkeypatch):
    import gpudoc

    where = cuda.S.where_module
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert cuda._where("arm", opt) is True
    loss = model(torch.randn(2, 4)).sum()  # the measured step's forward
    listed = [p["target"] for p in gpudoc.patches()]
    assert listed.count(where.NODE_HOOK) == 3  # a's output; b's, which is the model's (a row and the root)
    marks = []
    monkeypatch.setattr(where.Measure, "mark", lambda self, i, root: marks.append(i))
    cuda._where("close")  # the measure ends before the program's backward (it keeps its graph)
    assert where.NODE_HOOK not in [p["target"] for p in gpudoc.patches()]
    loss.backward()
    assert marks == []
