"""The unchanged PyTorch training loop the torch.compile tests run on eager and compiled models."""
import torch
import torch.nn.functional as F


def train_loop(model, step_fn, batches, lr=0.05):
    """SGD (momentum 0.9) over `batches` with `step_fn` as the forward; returns the losses and
    each step's gradients (None for a parameter without one)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, grads = [], []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(step_fn(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return losses, grads
