"""build_aot is not silent for ten minutes: it says what it compiles, for which targets,
and each ninja step as it goes (through the AOT backend's build subprocess)."""

from __future__ import annotations

import logging

import pytest

from sm120fork.aot.compile import NinjaProgress
from sm120fork.aot.pipeline import _forward_progress


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sm120fork"]


def test_each_ninja_step_is_one_line_naming_file_and_targets(
        caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("sm120fork")
    own = not logger.propagate  # the CLI stops propagation once it ran in this process
    if own:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="sm120fork")
    try:
        progress = NinjaProgress()
        progress("[3/12] /usr/local/cuda/bin/nvcc -gencode=arch=compute_90a,code=sm_90a "
                 "-gencode=arch=compute_120f,code=sm_120f -c csrc/trtllm_allreduce.cu -o x.o")
        progress("ptxas info: not a step")
        _forward_progress("INFO     AOT build step 3/12 after 41 s: trtllm_allreduce.cu "
                          "(sm_90a, sm_120f)")
        _forward_progress("INFO     compiling trtllm_comm for sm_90a sm_120f (cuda 13.0, 2 "
                          "jobs): this takes minutes per target")
        _forward_progress("some compiler chatter")
    finally:
        if own:
            logger.removeHandler(caplog.handler)
    got = _messages(caplog)
    assert len(got) == 3
    assert got[0].startswith("AOT build step 3/12 after ")
    assert got[0].endswith(" s: trtllm_allreduce.cu (sm_90a, sm_120f)")
    assert got[1] == "AOT build step 3/12 after 41 s: trtllm_allreduce.cu (sm_90a, sm_120f)"
    assert got[2].startswith("compiling trtllm_comm for sm_90a sm_120f")
