"""The GPU harnesses (``test``, ``bench``, ``sglang-layer``, ``upstream-tests``) over one
shared core; ranks are separate processes.  Everything but the rank side imports without a
GPU or FlashInfer, and nothing here imports cli/, rich or git (GPU boxes lack them).
"""
