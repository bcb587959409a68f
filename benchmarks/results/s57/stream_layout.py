"""Session 57 probe (issue 23): what the Whisper encoder's transposed residual stream costs.

copies.py found (H100) that WhisperEncoder's ``inputs_embeds.permute(0, 2, 1) + positions``
keeps the residual stream [batch, time, hidden] with the time axis innermost, so each of its
12 residual adds mixes layouts (27 us each) and each of its 13 layer norms copies its input
first (22 us each): 610 of the forward's ~2 ms, in eager and in dnntune's forward alike. Here
the same model with the stream made contiguous once, before the first layer (a forward
pre-hook on ``layers[0]``), against the model as it is: both replayed as plain CUDA graphs,
timed side by side in interleaved rounds, outputs compared.
"""

import copy, statistics, sys, time

sys.path.insert(0, "benchmarks")
import torch
from _models_zoo import SPECS, Setting

s = Setting(torch.device("cuda"), torch.bfloat16, False)
torch.manual_seed(0)
w = SPECS["whisper_encoder"].build(s)
base, (x,) = w.model, w.inputs
flat = copy.deepcopy(base)
flat.layers[0].register_forward_pre_hook(lambda mod, args: (args[0].contiguous(), *args[1:]))


def graphed(m):
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                m(x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = m(x)
    return g, out[0] if isinstance(out, tuple) else out.last_hidden_state


forms = {"as_is": graphed(base), "contiguous_stream": graphed(flat)}
ms = {k: [] for k in forms}
for r in range(10):
    for k in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
        g = forms[k][0]
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(50):
            g.replay()
        torch.cuda.synchronize(); ms[k].append((time.perf_counter() - t) / 50 * 1e3)
a, b = forms["as_is"][1], forms["contiguous_stream"][1]
print("[stream] ms per replayed forward (median of 10 rounds):",
      {k: round(statistics.median(v), 4) for k, v in ms.items()},
      "paired as_is / contiguous:", round(statistics.median(x / y for x, y in zip(ms["as_is"], ms["contiguous_stream"])), 3),
      "max abs diff:", (a.float() - b.float()).abs().max().item(), "output strides:", a.stride(), b.stride(), flush=True)
