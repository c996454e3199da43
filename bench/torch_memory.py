"""Peak memory of one PyTorch eager training step, from PyTorch's own memory timeline
(torch.profiler with profile_memory, the data behind `export_memory_timeline`)."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action

#: timed repeats of the step; the median is reported
REPEATS = 5


def measure_torch_step(model, x, y, trained: set[str], lr: float = 0.01) -> dict:
    """One SGD step of `model` (eval mode, as edgetrain compiles it) training only the
    parameters in `trained`. `activation_bytes` is the peak of the bytes allocated during
    the step and still alive (activations saved for backward, gradients, temporaries);
    weights existing before the step are not in it."""
    model.eval()
    params = dict(model.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in trained)
    opt = torch.optim.SGD([params[n] for n in sorted(trained)], lr=lr)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    first_loss = step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step()
    live, cur, peak = {}, 0, 0
    for _, action, (key, _version), size in prof._memory_profile().timeline:
        if action == Action.CREATE:
            live[key] = size
            cur += size
        elif action == Action.DESTROY:
            cur -= live.pop(key, 0)
        peak = max(peak, cur)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    for p in params.values():
        p.requires_grad_(True)
    trained_bytes = sum(params[n].numel() * params[n].element_size() for n in trained)
    return {"activation_bytes": peak, "trained_weights_bytes": trained_bytes,
            "peak_bytes": peak + trained_bytes,
            "weights_bytes": sum(p.numel() * p.element_size() for p in params.values()),
            "first_loss": first_loss, "step_ms": 1000 * sorted(times)[REPEATS // 2]}
