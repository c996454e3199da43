"""Group normalisation (instance normalisation is its one-channel-per-group case) and its backward ops."""
