"""Update schemes: which parameters (and which of their channels) training updates
(defined in trainable/, re-exported here); contribution analysis and the budgeted search for
a sparse scheme (update="auto"), which run the pipeline's phases."""
from .auto import CostCache, SearchInfo, search_scheme
from .contribution import (ContributionError, ContributionTable, analyze_contributions, scheme_accuracies,
                           scheme_accuracy)
from .finetune import FineTune, FineTuneError
from .scheme_layers import SchemeLayers, scheme_layers
from ..trainable import BiasOnly, Full, LastK, Layer, Sparse, UpdateScheme, find_layers, resolve_scheme

__all__ = ["BiasOnly", "ContributionError", "ContributionTable", "CostCache", "FineTune", "FineTuneError", "Full",
           "LastK", "Layer", "SchemeLayers", "SearchInfo", "Sparse", "UpdateScheme", "analyze_contributions",
           "find_layers", "resolve_scheme", "scheme_accuracies", "scheme_accuracy", "scheme_layers", "search_scheme"]
