"""Урок 12.2, уровень C: ZeRO-1 на настоящих процессах — байты состояния AdamW на каждом ранге."""

from __future__ import annotations

import os

from course_utils.args import integer
from course_utils.memory import (
    RECIPES,
    _bytes,
    build_probe_model,
    optimizer_state_bytes,
    per_rank_breakdown,
    tensor_bytes,
)


def measure_zero_state(
    rank: int, world_size: int, backend: str, hidden: int = 256, layers: int = 4, seed: int = 0
) -> dict:
    """Уровень C: ``ZeroRedundancyOptimizer(AdamW)`` + DDP, один шаг; ранг меряет байты весов,
    градиентов и состояний AdamW, которые хранит. Прогноз ZeRO-1 (fp32_adam): ⌈N/D⌉·8 Б на ранг;
    тензоры раздаются целиком, поэтому доли рангов неравны, а сумма — ровно 8·N Б."""
    rank = integer("rank", rank, 0)
    world_size = integer("world_size", world_size, 1)
    h = integer("hidden", hidden, 1)
    n_layers = integer("layers", layers, 1)
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.optim import AdamW

    from course_utils.multiproc.launcher import local_device

    device = local_device(backend)
    model = build_probe_model(h, n_layers, seed).to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=AdamW, lr=1e-3)
    gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
    x = torch.randn(8, h, generator=gen).to(device)  # пакет из 8 примеров
    target = torch.randn(8, h, generator=gen).to(device)
    loss = torch.nn.functional.mse_loss(ddp(x), target)
    loss.backward()
    optimizer.step()

    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    opt_bytes = optimizer_state_bytes(optimizer.optim)
    assigned = [p for group in optimizer.optim.param_groups for p in group["params"]]
    checksum = sum(p.detach().double().sum().item() for p in params)  # Σ весов: равны ли ранги
    mine = torch.tensor([opt_bytes, checksum], dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world_size)]
    torch.distributed.all_gather(gathered, mine)  # (байты состояния, Σ весов) каждого ранга
    by_rank = [int(t[0].item()) for t in gathered]

    rec = RECIPES["fp32_adam"]
    adam = rec.m1_bytes + rec.m2_bytes  # Б/параметр в состоянии AdamW
    zero1 = per_rank_breakdown(n_params, rec, world_size, zero_stage=1)["optimizer"]
    out = {"rank": rank, "pid": os.getpid(), "n_params": n_params, "loss": float(loss.item())}
    out |= {"param_bytes": tensor_bytes(params), "grad_bytes": tensor_bytes(p.grad for p in params)}
    out |= {"optimizer_state_bytes": opt_bytes, "assigned_tensors": len(assigned)}
    out["predicted_assigned_state_bytes"] = _bytes(sum(p.numel() for p in assigned), adam)
    out |= {"optimizer_state_bytes_by_rank": by_rank, "optimizer_state_bytes_sum": sum(by_rank)}
    out["full_optimizer_state_bytes_predicted"] = _bytes(n_params, adam)
    out["predicted_zero1_optimizer_bytes_per_rank"] = zero1
    out["params_in_sync"] = all(t[1].item() == gathered[0][1].item() for t in gathered)
    return out
