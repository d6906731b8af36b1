import torch
import torch.nn as nn

from prorl_bench.dual_lora import adapter_scales, attach_dual_lora, route_rows


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(6, 6)
        self.o = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.tanh(self.q(x)))


def _net() -> Net:
    torch.manual_seed(0)
    n = Net()
    attach_dual_lora(n, ["q", "o"], 2, 3, 4.0, freeze_base=True)
    with torch.no_grad():  # non-zero B so every path carries gradient
        for name, p in n.named_parameters():
            if "lora_" in name and "_B" in name:
                p.normal_()
    return n


def _grads(n: Net, x: torch.Tensor, mask: torch.Tensor | None, rows: torch.Tensor | None = None):
    n.zero_grad()
    with route_rows(n, mask) if mask is not None else torch.enable_grad():
        y = n(x)
    w = torch.ones(x.shape[0]) if rows is None else rows.float()
    ((y.pow(2).flatten(1).sum(-1) * w).sum() / x.shape[0]).backward()  # same normalisation: full batch size
    return {k: p.grad.clone() for k, p in n.named_parameters() if p.grad is not None}


def test_retain_grads_come_only_from_unlabelled_rows() -> None:
    n = _net()
    x = torch.randn(5, 4, 6)
    mask = torch.tensor([True, False, True, False, False])
    routed = _grads(n, x, mask)
    unlabelled_only = _grads(n, x, None, rows=~mask)
    full = _grads(n, x, None)
    for k, g in routed.items():
        if "retain" in k:
            torch.testing.assert_close(g, unlabelled_only[k], rtol=0, atol=1e-6)
        else:  # forget adapter learns from every row, labelled ones included
            torch.testing.assert_close(g, full[k])
            assert not torch.allclose(g, unlabelled_only[k])
    with route_rows(n, mask):
        y_routed = n(x)
    torch.testing.assert_close(y_routed, n(x), rtol=0, atol=0)  # forward values unchanged


def test_forget_scale_zero_equals_model_without_forget() -> None:
    n = _net()
    x = torch.randn(3, 6)
    with adapter_scales(n, "retain_only"):
        y = n(x)
    with torch.no_grad():
        for name, p in n.named_parameters():
            if "lora_forget_B" in name:
                p.zero_()
    torch.testing.assert_close(y, n(x))
    with adapter_scales(n, "both"):
        torch.testing.assert_close(y, n(x))
