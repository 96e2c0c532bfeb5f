"""A compiled optimizer step is counted (issue 42, item 4): the step hook, traced by Dynamo into the
compiled step, leaves only its count, which Dynamo replays at each run of the compiled code, with no
graph break and no recompile; the forward clock sees those steps and ends (training). Real torch on the
CPU, compiled with Dynamo's `eager` backend: the graphs, graph breaks, recompiles and the replay of the
hook's count are Dynamo's, whatever backend then compiles the graph (inductor, the default, builds C++
kernels with the machine's compiler: 23 of the suite's 56 s on the 2-core machine, for nothing more).
tests/gpu/shim_round3.py compiles steps with inductor on a real GPU."""
import pytest


torch = pytest.importorskip("torch")


def test_compiled_steps_are_counted_without_a_graph_break_or_recompile(shim):
    from torch._dynamo.utils import counters
    from torch.optim.optimizer import register_optimizer_step_post_hook

    T = shim.torch

    def train(hook):
        """Four steps of a compiled `opt.step()`, with the shim's step hook or without: what Dynamo
        made of it (graphs, graph breaks)."""
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        handle = register_optimizer_step_post_hook(T._on_step) if hook else None
        if hook:
            T._forward_clock_on(torch)
            model(torch.randn(2, 8))  # the clock takes the model at its first call
            assert T.F.root() is model

        @torch.compile(backend="eager")
        def step():
            opt.step()

        try:
            for _ in range(4):
                model(torch.randn(2, 8)).sum().backward()
                step()
                opt.zero_grad()
        finally:
            if handle is not None:
                handle.remove()
        return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())

    bare = train(False)
    assert T.STEP[0] == 0
    assert train(True) == bare
    assert T.STEP[0] == 4
    # The steps the compiled code ran end the forward clock at the model's next call: it is training.
    assert T.F.root is None
    assert "__call__" not in vars(torch.nn.Linear)
    torch._dynamo.reset()
    counters.clear()  # the where-walk reads them to tell a compiled program (later tests)
