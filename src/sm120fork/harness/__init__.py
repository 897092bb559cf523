"""Harness: real SGLang modules run with a faked GPU, shared by verify/ and gpu/.

Below both stages: verify's behaviour checks and the GPU layer harness's CPU mode use the
same fake. Modules here run inside probe and rank interpreters beside the tree under
test, so they import nothing of ``sm120fork`` beyond this package.
"""
