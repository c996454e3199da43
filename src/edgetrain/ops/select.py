"""Selection and scans: where with a tensor condition, cumsum, index_put, and their VJPs."""
