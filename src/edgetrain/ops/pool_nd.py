"""3-D pooling and adaptive pooling with windows of unequal size, and their backward ops."""
