"""Verify: the evidence each patch's ``Verified-By`` header names, made from the stack."""
