"""TRITON_ENGINE's kernels in Triton's interpreter (``TRITON_INTERPRET=1``) on the CPU.

Runs only where ``triton`` is importable (it is not a CI dependency: without it the test is
skipped). Each generated case whose graph a Triton kernel matches runs that kernel with its
default config, and with the solver's first candidates, on CPU tensors in a fresh process (the
interpreter must be chosen before the kernels are imported), and is compared with
``dnntune.reference``. A failure prints the case's graph JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from interpreter import interpreter_problem, run_interpreted

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, sys
import torch
from dnntune import reference
from dnntune.errors import NotSupportedError
from dnntune.providers.triton.engine import build_launcher
from dnntune.providers.triton.patterns import match_graph
from dnntune.providers.triton.solvers import DeviceLimits, solver_for
from dnntune.testing.conformance import generate_cases

count, ran, bad = int(sys.argv[1]), 0, []
for case in generate_cases(seed=0, count=count, size="small"):
    if case.shape_class in ("wide_row", "many_rows", "large"):
        continue  # the interpreter runs one program at a time: keep it small
    graph = case.graph()
    try:
        match = match_graph(graph)
    except NotSupportedError:
        continue
    if match.kernel in ("matmul", "attention") and case.dtype == "bf16":
        continue  # the interpreter's tl.dot has no bf16 (the GPU tests run these)
    solver = solver_for(match)
    configs = [solver.default(match, DeviceLimits())]
    configs += solver.candidates(match, DeviceLimits(), {})[:2]
    pack = reference.make_inputs(graph, "cpu", seed=0)
    outputs = graph.output_tensors()
    out_uids = {o.uid for o in outputs}
    expected = reference.run(graph, {u: t for u, t in pack.items() if u not in out_uids})
    for config in configs:
        launcher = build_launcher(match, config)
        for t in outputs:
            pack[t.uid].fill_(float("nan"))
        workspace = torch.empty(max(1, launcher.workspace_bytes), dtype=torch.uint8)
        launcher(pack, workspace)
        ran += 1
        for t in outputs:
            cmp = reference.compare(pack[t.uid], expected[t.uid], reference.tolerance_for(graph, t))
            if not cmp.ok:
                bad.append({"case": case.name, "config": config, "message": cmp.message,
                            "graph": case.doc()})
print(json.dumps({"ran": ran, "bad": bad}))
"""


def test_triton_kernels_in_the_interpreter_match_the_reference() -> None:
    problem = interpreter_problem()
    if problem is not None:
        pytest.skip(problem)
    result = run_interpreted(["-c", _SCRIPT, "120"], timeout=280)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ran"] > 0
    assert not report["bad"], json.dumps(report["bad"][:3], indent=1)
