"""The command line: :func:`sm120fork.cli.main.main` is the one place that prints or exits."""
