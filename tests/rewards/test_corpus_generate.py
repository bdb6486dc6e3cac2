"""The generated SFT corpus (rewards/corpus/generate.py): many ops x shapes, correct answers, and no
held-out task of the project's own split in it."""
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import rewards.corpus.generate as gen
from rewards.tasks.loader import load_builtin, load_kernelbench

CONF = Path(__file__).resolve().parents[2] / "conf"


def _project_split() -> tuple[float, int]:
    r = OmegaConf.load(CONF / "reward" / "kernel.yaml")
    return float(r.holdout_frac), int(r.split_seed)


@pytest.fixture(scope="module")
def held():
    frac, seed = _project_split()
    out = gen.project_holdout("builtin", frac, seed)
    assert out, "the project's split holds tasks out"
    return out


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
def test_no_held_out_task_appears_in_the_corpus(held, backend):
    items = gen.generate(held, backend)
    named = gen.held_out_ops(t for t, _ in held)
    held_exprs = set().union(*(gen._forward_exprs(s) for _, s in held))
    held_shapes = set().union(*(gen._sizes(s) for _, s in held))
    for it in items:
        assert it.op not in named and not (gen._words(it.op) & named), it.task_id
        assert not (gen._forward_exprs(it.reference) & held_exprs), it.task_id
        assert it.shape not in held_shapes, it.task_id
        assert it.task_id.partition("/")[2].split("_", 1)[1] not in {t.partition("/")[2].split("_", 1)[1] for t, _ in held}
    builtin_ids = {t.id for t in load_builtin()}
    assert not builtin_ids & {it.task_id for it in items}
    # the held-out tasks of this split name sigmoid and relu: neither is generated
    assert {t for t, _ in held} >= {"L1/21_sigmoid"}
    assert not {"sigmoid", "relu", "mul_sigmoid", "add_relu"} & {it.op for it in items}


def test_a_held_out_op_or_shape_is_dropped_whatever_its_name():
    tanh = (Path(load_builtin()[0].path).parent / "20_tanh.py").read_text()
    items = gen.generate([("L1/20_tanh", tanh)])
    assert "tanh" not in {it.op for it in items} and "gelu_tanh" not in {it.op for it in items}
    # a task computing an op under another name is caught by its forward expression
    items = gen.generate([("L1/99_other", tanh.replace("torch.tanh(x)", "torch.nn.functional.softsign(x)"))])
    assert "softsign" not in {it.op for it in items}
    # a held-out shape is dropped for every op
    items = gen.generate([("L1/98_thing", "BATCH = 4096\nDIM = 4096\nclass Model:\n    def forward(self, x):\n        return x\n")])
    assert (4096, 4096) not in {it.shape for it in items} and items


def test_corpus_is_varied(held):
    items = gen.generate(held, "cuda")
    assert len(items) >= 200 and len({it.op for it in items}) >= 25
    assert len({it.shape for it in items}) >= 8 and len({it.style for it in items}) >= 4
    assert len({it.answer for it in items}) == len(items)


def test_written_tree_loads_and_feeds_sft(tmp_path, held):
    from pipeline.sft_data import jsonl_conversations

    items = gen.generate(held, "cpu", ops=["silu", "add"], shapes=gen.SHAPES[:2])
    path = gen.write(items, tmp_path)
    tasks = load_kernelbench(tmp_path, levels=(1, 2), profile="cpu")
    assert {t.id for t in tasks} == {it.task_id for it in items}
    convs = jsonl_conversations(path, {t.id for t in tasks})
    assert len(convs) == len(items) and "```python\n" in convs[0].response


def test_every_op_expression_matches_its_torch_reference():
    """All ops' kernel expressions in one C++ build, each against the task's own torch expression."""
    from torch.utils.cpp_extension import load_inline

    unary, binary = list(gen.UNARY), list(gen.BINARY)
    cases = "".join(f"        case {i}: {{ float v = x[j]; o[j] = {gen.UNARY[op][1]}; break; }}\n" for i, op in enumerate(unary))
    bcases = "".join(f"        case {i}: {{ float a = x[j]; float b = y[j]; o[j] = {gen.BINARY[op][1]}; break; }}\n"
                     for i, op in enumerate(binary))
    src = (
        "#include <torch/extension.h>\n#include <cmath>\n"
        "torch::Tensor un(torch::Tensor xt, int64_t op) { auto ot = torch::empty_like(xt); const float* x = xt.data_ptr<float>();"
        " float* o = ot.data_ptr<float>(); for (int64_t j = 0; j < xt.numel(); ++j) { switch (op) {\n"
        f"{cases}        default: TORCH_CHECK(false, \"op\"); }} }} return ot; }}\n"
        "torch::Tensor bi(torch::Tensor xt, torch::Tensor yt, int64_t op) { auto ot = torch::empty_like(xt);"
        " const float* x = xt.data_ptr<float>(); const float* y = yt.data_ptr<float>(); float* o = ot.data_ptr<float>();"
        " for (int64_t j = 0; j < xt.numel(); ++j) { switch (op) {\n"
        f"{bcases}        default: TORCH_CHECK(false, \"op\"); }} }} return ot; }}\n")
    ext = load_inline(name="gen_corpus_exprs_check", cpp_sources=src, functions=["un", "bi"], extra_cflags=["-O1"])
    torch.manual_seed(0)
    x = torch.randn(4096) * 4
    y = torch.randn(4096) * 4
    for i, op in enumerate(unary):
        want = eval(gen.UNARY[op][0], {"torch": torch, "x": x})
        torch.testing.assert_close(ext.un(x, i), want, rtol=1e-4, atol=1e-5, msg=op)
    for i, op in enumerate(binary):
        want = eval(gen.BINARY[op][0], {"torch": torch, "a": x, "b": y})
        torch.testing.assert_close(ext.bi(x, y, i), want, rtol=1e-4, atol=1e-5, msg=op)
    assert math.isfinite(float(ext.un(torch.tensor([50.0]), unary.index("mish"))))
