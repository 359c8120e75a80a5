"""Three small inference architectures for model-slot serving (issue 7).

* :class:`MLP`: Linear -> BatchNorm1d -> ReLU blocks and a linear head (the
  BatchNorm running statistics are buffers, ``num_batches_tracked`` an int64
  buffer, so a slot set holds mixed dtypes).
* :class:`MessagePassingGNN`: a message-passing graph network in the style of
  Gilmer et al. 2017 ("Neural Message Passing for Quantum Chemistry"): per
  layer, messages ``W_m h_src`` are summed at their destination node with
  ``Tensor.index_add_`` and the node state is updated from ``[h, sum]``.
* :class:`MoEModel`: an input projection, a top-2 mixture-of-experts feed
  forward layer (:class:`Top2MoE`) and a head. Routing follows GShard
  (Lepikhin et al. 2020): each token goes to its two highest-scoring experts,
  every expert takes at most ``capacity`` tokens (overflow is dropped), so
  every tensor of the forward has a static shape and the step's allocation
  sizes do not depend on the routing - what a planned step needs.

Random init, synthetic inputs: nothing is downloaded. Factories and example
inputs at test size are in :data:`ARCHITECTURES`.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """``layers`` hidden blocks of Linear -> BatchNorm1d -> ReLU, then a Linear.

    Input: ``(batch, in_dim)`` float32; output: ``(batch, out_dim)``.
    """

    def __init__(self, in_dim: int = 64, hidden: int = 512, out_dim: int = 16, layers: int = 3) -> None:
        super().__init__()
        blocks = []
        d = in_dim
        for _ in range(layers):
            blocks += [nn.Linear(d, hidden), nn.BatchNorm1d(hidden), nn.ReLU()]
            d = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(d, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MessagePassingGNN(nn.Module):
    """Message passing with sum aggregation by ``index_add_``.

    Inputs: node features ``x`` of shape ``(nodes, in_dim)`` and ``edge_index``
    of shape ``(2, edges)`` (int64, row 0 source, row 1 destination). Output:
    ``(nodes, out_dim)``.
    """

    def __init__(self, in_dim: int = 32, hidden: int = 256, out_dim: int = 8, layers: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.message = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.update = nn.ModuleList(nn.Linear(2 * hidden, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        src, dst = edge_index[0], edge_index[1]
        for message, update in zip(self.message, self.update):
            m = message(h).index_select(0, src)
            agg = torch.zeros_like(h).index_add_(0, dst, m)
            h = F.relu(update(torch.cat([h, agg], dim=1)))
        return self.out(self.norm(h))


class Top2MoE(nn.Module):
    """Top-2 mixture-of-experts feed-forward layer with a fixed expert capacity.

    Each of ``tokens`` inputs is sent to its two best experts by a linear
    router (softmax, top-2, the two weights renormalised). Expert ``e`` takes
    the first ``capacity = ceil(capacity_factor * 2 * tokens / experts)``
    assignments in order (all first choices before second choices, as in
    GShard); the rest are dropped. Experts are two-layer ReLU MLPs, evaluated
    as one batched matmul over ``(experts, capacity, d_model)``.

    Input ``(tokens, d_model)``; output ``(tokens, d_model)``.
    """

    def __init__(self, d_model: int = 128, d_ff: int = 256, experts: int = 8,
                 capacity_factor: float = 2.0) -> None:
        super().__init__()
        self.experts = experts
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(d_model, experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(experts, d_model, d_ff))
        self.b1 = nn.Parameter(torch.zeros(experts, d_ff))
        self.w2 = nn.Parameter(torch.empty(experts, d_ff, d_model))
        self.b2 = nn.Parameter(torch.zeros(experts, d_model))
        nn.init.normal_(self.w1, std=1.0 / math.sqrt(d_model))
        nn.init.normal_(self.w2, std=1.0 / math.sqrt(d_ff))
        # A constant that is not part of the state_dict (a non-persistent buffer).
        self.register_buffer("router_scale", torch.tensor(1.0 / math.sqrt(d_model)), persistent=False)

    def capacity(self, tokens: int) -> int:
        """Assignments each expert takes for ``tokens`` inputs."""
        return max(1, math.ceil(self.capacity_factor * 2 * tokens / self.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        e, c = self.experts, self.capacity(t)
        probs = F.softmax(self.router(x) * self.router_scale, dim=-1)
        top_p, top_e = probs.topk(2, dim=-1)                       # (t, 2)
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
        flat_e = top_e.t().reshape(-1)                              # (2t,) first choices first
        # One-hot by scatter (F.one_hot checks its input on the host: a sync
        # that a CUDA graph cannot capture).
        one_hot = torch.zeros(2 * t, e, dtype=torch.long, device=x.device).scatter_(1, flat_e[:, None], 1)
        pos = (one_hot.cumsum(0) - 1).gather(1, flat_e[:, None]).squeeze(1)
        keep = pos < c
        row = torch.where(keep, flat_e * c + pos, torch.full_like(pos, e * c))  # e*c: drop row
        tokens = torch.arange(t, device=x.device).repeat(2)
        buf = x.new_zeros(e * c + 1, d)
        buf[row] = x[tokens]                                        # kept rows are distinct
        h = buf[: e * c].view(e, c, d)
        h = F.relu(torch.baddbmm(self.b1[:, None, :], h, self.w1))
        y = torch.baddbmm(self.b2[:, None, :], h, self.w2).reshape(e * c, d)
        y = torch.cat([y, y.new_zeros(1, d)])                       # the drop row outputs 0
        weight = (top_p.t().reshape(-1) * keep).unsqueeze(1)        # (2t, 1)
        return (y[row] * weight).view(2, t, d).sum(0)


class MoEModel(nn.Module):
    """Input projection -> :class:`Top2MoE` (residual) -> LayerNorm -> head.

    Input ``(tokens, in_dim)``; output ``(tokens, out_dim)``.
    """

    def __init__(self, in_dim: int = 32, d_model: int = 128, d_ff: int = 256, experts: int = 8,
                 out_dim: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(in_dim, d_model)
        self.moe = Top2MoE(d_model, d_ff, experts)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = h + self.moe(h)
        return self.head(self.norm(h))


def random_graph(nodes: int, edges: int, generator: Optional[torch.Generator] = None,
                 device: object = None) -> torch.Tensor:
    """A random directed multigraph: ``edge_index`` of shape ``(2, edges)``, int64."""
    return torch.randint(0, nodes, (2, edges), generator=generator).to(device)


def example_inputs(arch: str, generator: Optional[torch.Generator] = None,
                   device: object = None) -> Tuple[torch.Tensor, ...]:
    """Inputs at test size for one of :data:`ARCHITECTURES` (on the CPU unless ``device``)."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    if arch == "mlp":
        return (torch.randn(16, 64, generator=g).to(device),)
    if arch == "gnn":
        return (torch.randn(48, 32, generator=g).to(device), random_graph(48, 160, g, device))
    if arch == "moe":
        return (torch.randn(32, 32, generator=g).to(device),)
    raise KeyError(f"unknown example architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")


#: Test-size factories (random init from the global generator; seed before calling).
ARCHITECTURES: Dict[str, Callable[[], nn.Module]] = {
    "mlp": lambda: MLP(64, 512, 16, 3),
    "gnn": lambda: MessagePassingGNN(32, 256, 8, 3),
    "moe": lambda: MoEModel(32, 128, 256, 8, 8),
}


def make_weights(arch: str, seed: int) -> Dict[str, torch.Tensor]:
    """A state_dict of a freshly initialised ``arch`` model (seeded), BatchNorm
    statistics randomised so that buffers matter."""
    torch.manual_seed(seed)
    m = ARCHITECTURES[arch]()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm1d):
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.num_batches_tracked.fill_(seed)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}
