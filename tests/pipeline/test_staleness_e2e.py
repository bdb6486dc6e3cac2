"""max_staleness = 2 through pipeline.main on CPU (real Ray actors, tiny Qwen2, FSDP2 on gloo, the
toy env): the run completes, no batch is trained more than 2 versions behind, the lag histogram
and the sampler/trainer mismatch reach metrics.jsonl, and the timeline shows the samplers
generating ahead while the trainer trains."""
import json

import pytest

from pipeline.main import run
from pipeline.timeline import Timeline
from tests.pipeline.test_e2e import TOY, config


@pytest.mark.slow
def test_two_versions_ahead_through_the_pipeline(ray_local, tmp_path):
    steps = 4
    run(config(*TOY, "pipeline.max_staleness=2", f"pipeline.steps={steps}", "checkpoint.every=0",
               "checkpoint.at_end=false", "algorithm.off_policy_correction=tis"), tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(steps))
    for m in lines:
        assert 0.0 <= m["pipeline/policy_lag"] <= m["pipeline/policy_lag_max"] <= 2.0
        assert m["pipeline/max_staleness"] == 2.0
        hist = [m[f"pipeline/policy_lag_hist/{v}"] for v in ("0", "1", "2", "gt2")]
        assert sum(hist) == pytest.approx(1.0) and hist[3] == 0.0
        assert m["staleness/dropped_samples"] == 0.0
        assert m["rollout_corr/k3_kl"] >= 0.0 and "rollout_corr/kl" in m and m["mismatch/abs_logprob_diff_max"] >= 0.0
    # step 0 trains with the samplers' own weights: only numerics separate their log-probs
    assert lines[0]["pipeline/policy_lag"] == 0.0
    assert lines[0]["mismatch/abs_logprob_diff_mean"] < 1e-3
    assert lines[-1]["pipeline/policy_lag_max"] >= 1.0  # later batches were generated ahead
    tl = Timeline.from_jsonl(tmp_path / "timeline.jsonl")
    assert sum(tl.overlap("train", n, "gen", m) for n in range(steps) for m in range(n + 1, steps)) > 0
