"""CUDA: the one nvcc locator, the binary tools (cuobjdump, nvdisasm, c++filt) and
reading cubins; shared by verify/ (the compile proof), aot/, gpu/ and doctor/.

Stdlib only (no GitPython, no rich): the doctor imports it on serving boxes.
"""
