"""Federated on-device fine-tuning: a fleet of devices, each training the same edgetrain
program on its own data, averaged by a server (FedAvg) over the tensors the scheme trains.
Simulated with Flower's simulation engine (flower.py; optional: pip install -e ".[scale]"), or
serially without it (rounds.run_serial, the reference the Flower run equals)."""
from .average import fed_average, model_bytes, requantize, update_bytes
from .flower import FlowerMissing, INSTALL_HINT, require_flower, run_flower
from .job import FederatedJob, build_setup, parse_scheme, setup_of
from .partition import dirichlet_partition, iid_partition, parse_partition, partition
from .rounds import (ClientUpdate, FederatedResult, RoundRecord, client_update, evaluate, final_state_dict,
                     run_centralized, run_serial, write_results)

__all__ = ["ClientUpdate", "FederatedJob", "FederatedResult", "FlowerMissing", "INSTALL_HINT", "RoundRecord",
           "build_setup", "client_update", "dirichlet_partition", "evaluate", "fed_average", "final_state_dict",
           "iid_partition", "model_bytes", "parse_partition", "parse_scheme", "partition", "require_flower",
           "requantize", "run_centralized", "run_flower", "run_serial", "setup_of", "update_bytes", "write_results"]
