"""The benchmarks' own arithmetic: what they report must mean what docs/performance.md says."""
import math

import torch

from bench.common import percentile, table
from bench.trainer import PRESETS, layout, make_micro_batches


def test_percentile_is_nearest_rank():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 95) == 5.0
    assert percentile(xs, 0) == 1.0
    assert math.isnan(percentile([], 50))


def test_table_has_a_row_per_result_and_markdown_header():
    out = table([{"a": 1, "b": 0.5}, {"a": 2, "b": None}]).splitlines()
    assert out[0].split("|")[1].strip() == "a" and set(out[1]) <= {"|", "-", " "}
    assert len(out) == 4 and out[3].split("|")[2].strip() == "-"


def test_micro_batches_respect_the_padded_budget():
    lengths = [100, 300, 50, 400, 400, 10]
    micro = make_micro_batches(lengths, budget=800)
    assert [n for m in micro for n in m] == lengths  # order kept, nothing lost
    assert all(max(m) * len(m) <= 800 or len(m) == 1 for m in micro)


def test_packed_and_padded_layouts_give_the_same_loss():
    """Packing must change the cost only: the same rows give the same next-token loss."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    arch = dict(PRESETS["cpu-small"], vocab_size=300, num_hidden_layers=1)
    cfg = Qwen2Config(**arch)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    lens = [7, 3, 12]
    losses = []
    for packed in (False, True):
        torch.manual_seed(1)  # same token ids in both layouts
        mb = layout(lens, 300, packed, torch.device("cpu"))
        labels = mb.pop("labels")
        with torch.no_grad():
            logits = model(**mb, use_cache=False).logits
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                        ignore_index=-100, reduction="sum"))
        assert int((labels != -100).sum()) == sum(n - 1 for n in lens)
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
