"""docs/policy.md's "What your box would run" is the code's own output (issue 33 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

from sm120fork.gpu import policy
from sm120fork.tune import example
from sm120fork.tune.run import Box, TuneOptions, WorldBench, tune

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "reports" / "doctor" / "scenarios"


def test_the_docs_page_shows_what_the_code_decides() -> None:
    page = (ROOT / "docs" / "policy.md").read_text()
    shown = page.partition(example.BEGIN)[2].partition(example.END)[0]
    rendered = example.render(SCENARIOS).partition(example.BEGIN)[2].partition(
        example.END)[0]
    assert shown == rendered, "run: python -m sm120fork.tune.example"


def test_every_box_of_the_issue_is_shown_and_its_bench_is_labelled_synthetic() -> None:
    for name in example.BOXES:
        assert (SCENARIOS / name / "facts.json").is_file(), name
    for file in SCENARIOS.glob(f"*/{example.SYNTHETIC_FILE}"):
        assert json.loads(file.read_text())["label"].startswith("SYNTHETIC")
    rows = {name: example.box_rows(
        json.loads((SCENARIOS / name / "facts.json").read_text()),
        example.load_synthetic(SCENARIOS / name))
        for name in example.BOXES[:3]}
    # across sockets without P2P, TP8 is never measured and keeps today's rule
    assert rows[example.BOXES[0]][2][0:2] == ["8", "no: GPU 0 cannot access GPU 4 (no P2P)"]
    # FlashInfer 0.6.x has no pcie_ipc: that box's policy never names it
    assert all("pcie_ipc" not in row[2] for row in rows["4x-one-pcie-switch"])


def test_tune_on_a_synthetic_box_installs_what_the_example_shows(tmp_path: Path) -> None:
    """The example's shortcut (derive, then decide) is what tune itself installs."""
    name = "8x-rtx-pro-6000-pcie-cross-socket-p2p-off"
    facts = json.loads((SCENARIOS / name / "facts.json").read_text())
    synthetic = example.load_synthetic(SCENARIOS / name)
    assert synthetic is not None

    def bench(tp: int, left: float | None) -> WorldBench:
        return WorldBench(world=tp, records=example.records(synthetic, tp),
                          tokens=(1, 4, 16, 32, 64, 128, 512), hidden=(7168,),
                          methods=("fused_auto",), finished=True, shared=False)

    target = tmp_path / "policy.json"
    tune(TuneOptions(stack="sglang-0.5.23", command="nox -s tune -- --stack sglang-0.5.23",
                     reports=tmp_path / "reports", yes=True),
         Box(doctor=lambda: facts, bench=bench, ask=None,
             environ={policy.ENV_VAR: str(target)}))
    installed = policy.load(target)
    from sm120fork.gpu import decision

    shown = example.box_rows(facts, synthetic)
    for row in shown:
        tp = int(row[0])
        d = decision.decide(installed, example.process_of(facts, tp))
        assert d.summary == row[2]
