"""The GPU layer harness: SGLang's fused-norm layer path, rank against rank (:mod:`.run`)."""
