"""Graph -> Graph passes."""
from .dce import eliminate_dead_code
from .loss import attach_loss
from .updates import apply_updates_early, insert_updates

__all__ = ["apply_updates_early", "attach_loss", "eliminate_dead_code", "insert_updates"]
