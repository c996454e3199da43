"""Convolutions beyond 2-D and transposed convolutions (conv3d, conv_transpose2d) and their backward ops."""
