"""Update schemes: which parameters (and which of their channels) training updates;
contribution analysis and the budgeted search for a sparse scheme (update="auto")."""
from .auto import CostCache, SearchInfo, search_scheme
from .contribution import (ContributionError, ContributionTable, analyze_contributions, scheme_accuracies,
                           scheme_accuracy)
from .finetune import FineTune, FineTuneError
from .layers import Layer, find_layers
from .scheme_layers import SchemeLayers, scheme_layers
from .schemes import BiasOnly, Full, LastK, Sparse, UpdateScheme, resolve_scheme

__all__ = ["BiasOnly", "ContributionError", "ContributionTable", "CostCache", "FineTune", "FineTuneError", "Full",
           "LastK", "Layer", "SchemeLayers", "SearchInfo", "Sparse", "UpdateScheme", "analyze_contributions",
           "find_layers", "resolve_scheme", "scheme_accuracies", "scheme_accuracy", "scheme_layers", "search_scheme"]
