#!/bin/sh
# Not run by the toolkit.
# from the project root
# the branch sits on the sglang 0.5.23 source import, not upstream's history: rebase with --onto <upstream ref> --repo <upstream checkout> before pushing
git -C .forks/trees/sglang-0.5.23/sglang push <your-fork-url> sm12x/sglang-0.5.23:sm12x/sglang-0.5.23
gh pr create --repo sgl-project/sglang --base main --head <your-github-user>:sm12x/sglang-0.5.23 --title 'SM120/SM121 support: 6 fixes (flashinfer_comm_fusion, overrides, add_norm, bootstrap)' --body-file reports/upstream/sglang-0.5.23-sglang/body.md
