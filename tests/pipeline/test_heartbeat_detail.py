"""The heartbeat's line on a step's reward tail: what the sampler workers' evaluations are doing."""
from pipeline.heartbeat import evaluator_detail


def test_the_evaluations_under_way_are_summed_over_workers_with_the_oldest_named():
    live = [{"generating": 1.0, "eval/queued": 0.0, "eval/build": 2.0, "eval/run": 1.0, "eval/oldest_s": 12.4,
             "eval/oldest_stage": 1.0},
            {"generating": 1.0, "eval/queued": 1.0, "eval/build": 0.0, "eval/run": 3.0, "eval/oldest_s": 95.2,
             "eval/oldest_stage": 2.0}]
    assert evaluator_detail(live) == (": 1 queued, 2 building, 4 at the device (waiting for it or running); "
                                      "the oldest 95 s, at the device (waiting for it or running)")


def test_nothing_is_said_where_no_worker_reports_evaluations_or_none_is_under_way():
    assert evaluator_detail([{"generating": 1.0}]) == ""
    assert evaluator_detail([{"eval/queued": 0.0, "eval/build": 0.0, "eval/run": 0.0}]) == ""
