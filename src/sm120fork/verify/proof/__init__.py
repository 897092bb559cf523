"""The SM12x compile proof of FlashInfer's trtllm comm module, and each patch's verdict
from it and the other evidence its header names."""
