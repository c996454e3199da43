"""Upsampling (nearest, linear, bilinear) and its backward op."""
