#!/bin/sh
# Not run by the toolkit.
# from the project root
# the branch sits on the flashinfer-python 0.7.4 source import, not upstream's history: rebase with --onto <upstream ref> --repo <upstream checkout> before pushing
git -C .forks/trees/flashinfer-0.7.4/flashinfer push <your-fork-url> sm12x/flashinfer-0.7.4:sm12x/flashinfer-0.7.4
gh pr create --repo flashinfer-ai/flashinfer --base main --head <your-github-user>:sm12x/flashinfer-0.7.4 --title 'SM120/SM121 support: 2 fixes (packaging, comm)' --body-file reports/upstream/flashinfer-0.7.4-flashinfer/body.md
