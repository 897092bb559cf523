"""What the GPU harnesses share; it imports no harness (an import contract)."""
