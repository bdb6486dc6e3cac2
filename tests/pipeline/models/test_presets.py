"""Model presets resolve to the fetch cache and say how to fill it; the worked example of the
cuda/triton prompt follows ``reward.worked_example``."""
import pytest
from hydra import compose, initialize_config_dir

from pipeline.conf_files import CONF_DIR
from pipeline.config import ConfigError, preflight, register
from pipeline.models.fetch import MODELS, fetch_hint

PRESETS = sorted(MODELS)


def _compose(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("name", PRESETS)
def test_a_preset_resolves_to_the_cache_and_names_the_fetch_command_when_missing(name, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_RL_CACHE", str(tmp_path))
    cfg = _compose("+experiment=toy", f"model={name}")
    assert cfg.model.path == str(tmp_path / "models" / name)
    with pytest.raises(ConfigError) as e:
        preflight(cfg)
    assert fetch_hint(name) in str(e.value) and "model.path=" in str(e.value)


def test_a_fetched_preset_passes_the_model_check(tmp_path, monkeypatch):
    from pipeline.models.load import check_checkpoint_dir
    from tests.pipeline.conftest import save_tiny_checkpoint

    monkeypatch.setenv("KERNEL_RL_CACHE", str(tmp_path))
    name = "smollm2-135m-instruct"
    cfg = _compose("+experiment=toy", f"model={name}")
    with pytest.raises(FileNotFoundError, match="fetch"):
        check_checkpoint_dir(cfg.model.path)
    save_tiny_checkpoint(cfg.model.path)   # a real HF checkpoint dir where the fetch would write one
    check_checkpoint_dir(cfg.model.path)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_the_worked_example_is_on_by_default_and_follows_its_key(backend):
    from rewards.config import load_reward_config
    from rewards.prompts import system_prompt, worked_example

    example = worked_example(backend)
    assert "```python" in example and "ModelNew" in example
    on = load_reward_config("kernel_cuda", dotlist=[f"backend={backend}"])
    off = load_reward_config("kernel_cuda", dotlist=[f"backend={backend}", "worked_example=false"])
    assert on.worked_example is True and off.worked_example is False
    assert example in system_prompt(backend, [], example=on.worked_example)
    assert example not in system_prompt(backend, [], example=off.worked_example)
    assert "An example of the format" not in system_prompt(backend, [], example=False)


def test_the_cpu_backend_has_no_worked_example():
    from rewards.prompts import system_prompt, worked_example

    assert worked_example("cpu") == ""
    assert system_prompt("cpu", [], example=True) == system_prompt("cpu", [], example=False)
