import random

from pipeline.algorithms import balance_across_ranks, micro_batches


def test_micro_batches_cover_every_row_once_within_the_budget():
    rng = random.Random(0)
    for _ in range(30):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(30, 200)
        parts = micro_batches(lengths, budget)
        assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
        for p in parts:
            assert len(p) == 1 or sum(lengths[i] for i in p) <= budget
        assert len(parts) <= len(lengths)


def test_row_longer_than_the_budget_goes_alone():
    parts = micro_batches([100, 5, 5, 5], 20)
    assert [0] in parts and sorted(map(len, parts)) == [1, 3]


def test_balance_across_ranks():
    lengths = [50, 10, 10, 10, 10, 10, 40, 20]
    parts = balance_across_ranks(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(8))
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert sums == [80, 80]
    assert balance_across_ranks([5, 6], 3) == [[0], [1], []]
    assert balance_across_ranks([5, 6], 1) == [[0, 1]]
