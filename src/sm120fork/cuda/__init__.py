"""CUDA: the one nvcc locator, the binary tools and reading cubins (stdlib only: the doctor
imports it on serving boxes)."""
