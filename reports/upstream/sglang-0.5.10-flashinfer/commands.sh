#!/bin/sh
# Not run by the toolkit.
# from the project root
# the branch sits on the flashinfer-python 0.6.7.post3 source import, not upstream's history: rebase with --onto <upstream ref> --repo <upstream checkout> before pushing
git -C .forks/trees/sglang-0.5.10/flashinfer push <your-fork-url> sm12x/flashinfer-0.6.7.post3:sm12x/flashinfer-0.6.7.post3
gh pr create --repo flashinfer-ai/flashinfer --base main --head <your-github-user>:sm12x/flashinfer-0.6.7.post3 --title 'SM120/SM121 support: 4 fixes (packaging)' --body-file reports/upstream/sglang-0.5.10-flashinfer/body.md
