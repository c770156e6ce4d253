"""The client's sans-IO core."""
