"""Executors of compiled graphs."""
