"""The broker's sans-IO core."""
