"""The worker's sans-IO core."""
