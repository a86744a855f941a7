"""The optimizer a run builds (``raysearch.training.optim.build_optimizer``) on the CPU.

Parameter groups given as generators or as one tensor build the optimizer torch builds from
lists, and one step moves the weights exactly as torch's own optimizer does; on the CPU no
fused step is asked for, and a config's own ``foreach`` reaches the optimizer. The CUDA half
(the fused step is taken on CUDA parameters) is in ``tests/test_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from raysearch.config import OptimizerConfig
from raysearch.training.optim import build_optimizer


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _step(net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.linspace(-1, 1, 20).reshape(5, 4)
    loss = torch.nn.functional.cross_entropy(net(x), torch.tensor([0, 1, 2, 1, 0]))
    opt.zero_grad()
    loss.backward()
    opt.step()


@pytest.mark.parametrize(("name", "cls"), [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW),
                                           ("adam", torch.optim.Adam)])
def test_groups_as_generators_and_tensors_step_as_torch_does(name, cls):
    ours_net, torch_net = _net(), _net()
    head = ours_net[2]
    config = OptimizerConfig(name=name, lr=0.1, weight_decay=1e-3)
    ours = build_optimizer(config, [{"params": (p for p in ours_net[0].parameters())},
                                    {"params": head.weight, "lr": 0.2},
                                    {"params": iter([head.bias])}])
    kwargs = config.kwargs()
    theirs = cls([{"params": list(torch_net[0].parameters())},
                  {"params": [torch_net[2].weight], "lr": 0.2},
                  {"params": [torch_net[2].bias]}], **kwargs)
    assert [len(g["params"]) for g in ours.param_groups] == [2, 1, 1]
    assert [g["lr"] for g in ours.param_groups] == [0.1, 0.2, 0.1]
    assert not ours.defaults["fused"]  # CPU parameters: torch's default step
    for _ in range(3):
        _step(ours_net, ours)
        _step(torch_net, theirs)
    for a, b in zip(ours_net.parameters(), torch_net.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_configs_own_foreach_reaches_the_optimizer():
    net = _net()
    opt = build_optimizer(OptimizerConfig(name="sgd", params={"foreach": False}),
                          net.parameters())
    assert opt.defaults["foreach"] is False
    assert not opt.defaults["fused"]


def test_one_tensor_for_params_is_torchs_own_error_in_one_line():
    with pytest.raises(ValueError, match=r"^optimizer 'sgd' with .*TypeError: params argument"):
        build_optimizer(OptimizerConfig(name="sgd"), torch.zeros(3, requires_grad=True))
