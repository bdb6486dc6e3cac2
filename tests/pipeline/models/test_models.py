import pytest
import torch

from pipeline.models import load_model_and_tokenizer, load_model_config, load_tokenizer
from tests.pipeline.conftest import save_tiny_checkpoint


def test_tiny_tokenizer_round_trips_and_has_a_qwen_chat_template(tiny):
    _, model, tok = tiny
    text = "__global__ void k(float* x) { x[0] = 1.f; } // ünïcode ✓"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                   tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == "<|im_end|>"
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert len(tok) <= model.config.vocab_size
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.num_hidden_layers == 2


def test_tiny_weights_are_a_function_of_the_seed():
    a, _ = load_model_and_tokenizer(load_model_config("tiny"))
    b, _ = load_model_and_tokenizer(load_model_config("tiny"))
    c, _ = load_model_and_tokenizer(load_model_config("tiny", ["tiny.seed=1"]))
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_saved_tiny_checkpoint_loads_through_the_local_path(tmp_path, tiny):
    _, model, tok = tiny
    path = save_tiny_checkpoint(str(tmp_path / "ckpt"))
    cfg = load_model_config("local", [f"path={path}", "dtype=float32"])
    loaded, ltok = load_model_and_tokenizer(cfg)
    for (n, p), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n
    text = "<|im_start|>user\nWrite ModelNew<|im_end|>"
    assert ltok(text)["input_ids"] == tok(text)["input_ids"]
    assert ltok.chat_template and ltok.eos_token == "<|im_end|>"
    assert load_tokenizer(cfg)("abc")["input_ids"] == tok("abc")["input_ids"]


def test_missing_or_malformed_model_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model.path='/no/such/model' is not a directory"):
        load_model_and_tokenizer(load_model_config("local", ["path=/no/such/model"]))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no weights.*config.json"):
        load_model_and_tokenizer(load_model_config("local", [f"path={tmp_path}"]))
    with pytest.raises(ValueError, match=r"model.dtype='fp8'"):
        load_model_and_tokenizer(load_model_config("tiny", ["dtype=fp8"]))
