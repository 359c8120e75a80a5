"""Bundled example models (real architectures, random init, synthetic data)."""
