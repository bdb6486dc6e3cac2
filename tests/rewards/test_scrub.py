"""Secrets never leave through evaluation text: the scrubber, and KernelEnv + the pipeline's writers
end to end with a fake sandbox pool (no compile)."""
import dataclasses
import json

import pytest

from rewards import scrub as scrub_mod
from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.interface import Turn
from rewards.scrub import REDACTED, Scrubber
from rewards.solutions import load_solution
from sandbox.result import SandboxResult, mark_refused_build

ENV_SECRET = "rAyT0kEn-9f8e7d6c5b4a39281706"
NETRC_SECRET = "Wb4ndbK3yX9q2LmPzR7s"
GCS = "ya29.AHES6ZRVmB7fkLtd1XTmq6mo0S1wqZZi3-Lh_s-6Uw7p8vtgSwg"


@pytest.fixture
def secrets_env(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {NETRC_SECRET}\n")
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_" + "Q" * 34 + "\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAY_AUTH_TOKEN", ENV_SECRET)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", GCS)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("WANDB_DIR", "/work/runs/some/dir")
    monkeypatch.setattr(scrub_mod, "_DEFAULT", None)  # the cached scrubber saw the old environment
    yield home


def test_environment_and_file_secrets_are_redacted(secrets_env):
    s = Scrubber.from_environment()
    text = f"RuntimeError: auth failed with {ENV_SECRET} / {NETRC_SECRET} / {GCS} / hf_{'Q' * 34}"
    out = s.scrub(text)
    for secret in (ENV_SECRET, NETRC_SECRET, GCS, "hf_" + "Q" * 34):
        assert secret not in out
    assert out.count(REDACTED) == 4 and out.startswith("RuntimeError: auth failed with ")
    assert s.scrub("see /work/runs/some/dir/x.log") == "see /work/runs/some/dir/x.log"  # paths are not secrets


def test_a_secret_cut_at_either_end_is_redacted(secrets_env):
    s = Scrubber.from_environment()
    assert ENV_SECRET[:12] not in s.scrub("error ... " + ENV_SECRET[:12])
    assert ENV_SECRET[-12:] not in s.scrub(ENV_SECRET[-12:] + " more log")


@pytest.mark.parametrize("secret", [
    "AKIAIOSFODNN7EXAMPLE", "ghp_" + "a1B2" * 9, "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
    "hf_" + "abcDEF123" * 4, "sk-proj-" + "Ab1_" * 8, "sk-ant-api03-" + "Zz9-" * 8, "xoxb-123456789012-abcdefghijkl",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
])
def test_known_secret_formats_are_redacted(secret):
    out = Scrubber().scrub(f"leaked: {secret} (end)")
    assert secret not in out and REDACTED in out and out.endswith("(end)")


@pytest.mark.parametrize("text,secret", [
    ("WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123456789abcdef01234567"),
    ("session token: " + "ab12" * 16, "ab12" * 16),
    ("X=" + "cd34" * 16, "cd34" * 16),
    ('{"api_key": "Zx9Kq2Lm8Np4Rt6Vw1Yz"}', "Zx9Kq2Lm8Np4Rt6Vw1Yz"),
    ("Authorization: Bearer abcDEF123ghiJKL456mno", "abcDEF123ghiJKL456mno"),
    ("https://user:p4ssw0rdXYZ@github.com/org/repo.git", "p4ssw0rdXYZ"),
])
def test_keyed_secrets_are_redacted(text, secret):
    assert secret not in Scrubber().scrub(text)


def test_a_typical_compile_error_stays_readable():
    log = """[1/3] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=relu_cpu -DTORCH_API_INCLUDE_EXTENSION_H \
-isystem /opt/venv/lib/python3.11/site-packages/torch/include -fPIC -std=c++17 -O3 -fopenmp \
-c /cache/builds/3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6/relu_cpu/main.cpp -o main.o
FAILED: main.o
/cache/builds/3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6/relu_cpu/main.cpp:12:5: error: 'tanhh' is not a member of 'std'
   12 |     out[i] = std::tanhh(x[i]) + key_offset_2;
      |                   ^~~~~
main.cpp:14:9: note: int tokens_per_block = compute_blocks_v2(n); auto key = hash_combine_64(seed, i);
commit 0123456789abcdef0123456789abcdef01234567, sha256 """ + "ab" * 32 + """
ninja: build stopped: subcommand failed.
RuntimeError: Error building extension 'relu_cpu'"""
    assert Scrubber(["unrelated-secret-value"]).scrub(log) == log


def test_scrub_cuts_after_redacting():
    s = Scrubber([ENV_SECRET], max_chars=20)
    out = s.scrub("x" * 15 + ENV_SECRET)
    assert ENV_SECRET[:5] not in out and out.startswith("x" * 15) and out.endswith("(truncated)")
    assert Scrubber().scrub(None) is None
    assert Scrubber().scrub_tree({"a": [1, "b"], "c": 2.0}) == {"a": [1, "b"], "c": 2.0}


class FakePool:
    """A sandbox whose verdicts are prepared by the test (nothing is compiled)."""

    def __init__(self, result):
        self.result = result

    async def evaluate(self, ref_src, code, backend):
        return self.result


def _reply(code):
    return f"I wrote a fused kernel.\n```python\n{code}\n```\n"


def _env(result):
    env = KernelEnv(load_reward_config("kernel", holdout_frac=0.0), FakePool(result))
    (task,) = [t for t in env.tasks("train") if t.task_id == "L2/9_scale_shift_tanh_residual"]
    return env, task


async def test_secrets_in_a_verdict_reach_no_feedback_sample_or_log(secrets_env, tmp_path):
    from pipeline.logger_config import LoggerConfig
    from pipeline.metrics import MetricsLogger
    from pipeline.sample import Sample

    leak = f"RuntimeError: ray auth {ENV_SECRET}; netrc {NETRC_SECRET}; {GCS}"
    result = SandboxResult(stage="load", error_kind="runtime_error", error=leak,
                        log_tail=f"Traceback ...\n  token={ENV_SECRET}\n{leak}", backend="cpu")
    env, task = _env(result)
    outcome = await env.score(task, _reply(load_solution("cpu", task.task_id)))
    assert outcome.score == 0.0 and outcome.error_kind == "runtime_error" and "ray auth" in outcome.feedback
    sample = Sample(uid="0/t/0/0", step=0, task_id=task.task_id, traj=0, turn=0, prompt_ids=[1], response_ids=[2],
                    logprobs=[-0.1], finish_reason="stop", score=outcome.score, policy_version=0,
                    response_text=f"ok {leak}", outcome=outcome)  # as pipeline.rollout builds it
    next_prompt = env.messages(task, [Turn(outcome.summary, outcome.answer, outcome.feedback)])
    cfg = LoggerConfig(backends=["jsonl"], project="p", entity=None, group=None, tags=[], mode="offline",
                       table_every=1, table_rows=2, timeline_every=0, console_keys=[])
    logger = MetricsLogger(cfg, tmp_path / "run", "run", {})
    logger.log_table(0, [sample], decode=lambda ids: "\n".join(m["content"] for m in next_prompt) + leak)
    logger.close()
    written = (tmp_path / "run" / "episodes.jsonl").read_text()
    assert json.loads(written.splitlines()[0])["task"] == task.task_id
    places = {"feedback": outcome.feedback, "verdict": json.dumps(outcome.verdict),
              "sample outcome": json.dumps(dataclasses.asdict(sample.outcome)), "prompt": json.dumps(next_prompt),
              "episodes.jsonl": written}
    for where, text in places.items():
        for secret in (ENV_SECRET, NETRC_SECRET, GCS):
            assert secret not in text, (where, secret)
    assert REDACTED in outcome.feedback and REDACTED in outcome.verdict["error"]


async def test_the_evaluator_crashing_with_a_secret_does_not_leak_it(secrets_env):
    class Crashing:
        async def evaluate(self, *a):
            raise ConnectionError(f"lost the worker (auth {ENV_SECRET})")

    env = KernelEnv(load_reward_config("kernel", holdout_frac=0.0), Crashing())
    task = env.tasks("train")[0]
    outcome = await env.score(task, _reply(load_solution("cpu", "L2/9_scale_shift_tanh_residual")))
    assert outcome.error_kind == "sandbox_error" and "lost the worker" in outcome.feedback
    assert ENV_SECRET not in json.dumps(dataclasses.asdict(outcome))


@pytest.mark.parametrize("flag", ["stale_output", "input_modified", "output_aliases_input", "output_aliases_output",
                                  "forged_message", "degenerate_check"])
async def test_a_run_time_violation_scores_zero_names_the_reason_and_is_a_rule_miss(flag):
    result = SandboxResult(stage="timing", compiled=True, correct=True, error_kind="rule_violation", flags=[flag],
                        error="a timed call's output differs from fresh work", speedup=50.0, timed=True, backend="cpu")
    env, task = _env(result)
    outcome = await env.score(task, _reply(load_solution("cpu", task.task_id)))
    assert outcome.score == 0.0 and outcome.error_kind == "rule_violation"
    assert flag in outcome.feedback and "rejected" in outcome.feedback
    assert "rule_miss" in outcome.verdict["flags"] and flag in outcome.verdict["flags"]
    assert outcome.hacks == ["rule_miss", flag]


async def test_a_build_the_hook_refused_is_a_disallowed_build_argument():
    result = SandboxResult(stage="compile", error_kind="compile_error", backend="cpu",
                        error="RuntimeError: disallowed build argument: extra_cflags: '-wrapper' is not an allowed "
                              "g++ flag (it hands arguments to, or picks, another program)")
    env, task = _env(mark_refused_build(result))  # as sandbox.pool.SandboxPool returns it: flagged
    # the answer passes the static rules (its flags are not literals), the sandbox refuses the build
    code = load_solution("cpu", task.task_id).replace('extra_cflags=["-O3"', 'extra_cflags=list(["-O3"])+["-O3"')
    outcome = await env.score(task, _reply(code))
    assert outcome.score == 0.0 and outcome.error_kind == "rule_violation", outcome.feedback
    assert "disallowed_build_argument" in outcome.feedback and "'-wrapper'" in outcome.feedback
    assert outcome.verdict["flags"] == ["disallowed_build_argument", "rule_miss"]


async def test_static_rules_still_come_first():
    env, task = _env(SandboxResult(stage="done", compiled=True, correct=True, speedup=2.0, timed=True))
    code = load_solution("cpu", task.task_id).replace('extra_cflags=["-O3"', 'extra_cflags=["-wrapper", "x", "-O3"')
    outcome = await env.score(task, _reply(code))
    assert outcome.error_kind == "rule_violation" and outcome.hacks == ["build_arguments"]
    assert "'-wrapper'" in outcome.feedback and "rule_miss" not in json.dumps(outcome.verdict)
