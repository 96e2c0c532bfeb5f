"""Small models the Python tests share (real torch on the CPU)."""
import torch


class Net(torch.nn.Module):
    """Two Linear layers with a ReLU between: a model of modules, as the forward clock sees one."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
