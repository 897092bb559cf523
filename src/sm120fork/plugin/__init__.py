"""Stock SGLang + our gates: the plugin generated from a stack's series (issue 12)."""
