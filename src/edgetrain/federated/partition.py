"""Splitting a labelled training set among simulated devices, seeded.

- iid: a random permutation cut into `clients` near-equal shards;
- dirichlet:ALPHA: the usual label-skew split of federated benchmarks (Hsu et al. 2019): for
  each class, the proportions of its images going to each client are drawn from
  Dirichlet(ALPHA, ..., ALPHA), and that class's images (shuffled) are cut by them. A small
  ALPHA gives each device few classes; a large one approaches iid.

Both return `clients` sorted index arrays that are disjoint and together cover every image.
A Dirichlet draw that leaves a client with fewer than `min_size` images is redrawn (from the
next seed of the same stream), as common implementations do, so every device trains.
"""
from __future__ import annotations

import numpy as np

#: redraws of a Dirichlet split before giving up on every client getting `min_size` images
MAX_DRAWS = 1000


def parse_partition(text: str) -> tuple[str, float]:
    """("iid", 0.0) or ("dirichlet", alpha) of 'iid' | 'dirichlet:ALPHA'; ValueError otherwise."""
    if text == "iid":
        return "iid", 0.0
    kind, sep, value = str(text).partition(":")
    if kind == "dirichlet" and sep:
        try:
            alpha = float(value)
        except ValueError:
            alpha = -1.0
        if np.isfinite(alpha) and alpha > 0:
            return "dirichlet", alpha
    raise ValueError(f"--partition {text!r}: write iid or dirichlet:ALPHA with ALPHA > 0 (e.g. dirichlet:0.5)")


def _check(n: int, clients: int) -> None:
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise ValueError(f"clients must be a positive int, got {clients!r}")
    if n < clients:
        raise ValueError(f"{n} images cannot be split among {clients} clients (each needs one at least)")


def iid_partition(n: int, clients: int, seed: int = 0) -> list[np.ndarray]:
    """`clients` shards of range(n), sizes differing by one at most."""
    _check(n, clients)
    order = np.random.default_rng([seed, 0x11D]).permutation(n)
    return [np.sort(part) for part in np.array_split(order, clients)]


def dirichlet_partition(labels: np.ndarray, clients: int, alpha: float, seed: int = 0,
                        min_size: int = 1) -> list[np.ndarray]:
    """`clients` shards of the indices of `labels`, each class split by Dirichlet(alpha) shares."""
    labels = np.asarray(labels)
    _check(len(labels), clients)
    if not alpha > 0:
        raise ValueError(f"the Dirichlet concentration must be > 0, got {alpha}")
    if min_size * clients > len(labels):
        raise ValueError(f"{len(labels)} images cannot give {clients} clients {min_size} each")
    for draw in range(MAX_DRAWS):
        rng = np.random.default_rng([seed, 0xD1, draw])
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(clients, float(alpha)))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        shards = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(s) for s in shards) >= min_size:
            return shards
    raise ValueError(f"no Dirichlet({alpha}) split of {len(labels)} images in {MAX_DRAWS} draws gives each of "
                     f"{clients} clients {min_size} images: use more images, fewer clients or a larger alpha")


def partition(text: str, labels: np.ndarray, clients: int, seed: int = 0) -> list[np.ndarray]:
    """The shards of `--partition text` (iid or dirichlet:ALPHA)."""
    kind, alpha = parse_partition(text)
    if kind == "iid":
        return iid_partition(len(labels), clients, seed)
    return dirichlet_partition(labels, clients, alpha, seed)
