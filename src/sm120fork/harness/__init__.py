"""Real SGLang modules run with a faked GPU (verify/ and gpu/); imports nothing of
``sm120fork`` beyond this package, as it runs beside the tree under test."""
