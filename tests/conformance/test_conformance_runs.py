"""How the differential tests against Kafka Streams run (tests/support/conformance.py): a seed
decides exactly which scenarios are compared, a report lists each difference once, and a run
over its time limit says so in one line. Fast: no Spark, no JVM."""

from __future__ import annotations

import pytest
from hypothesis import is_hypothesis_test

from tests.conformance import test_kafka_operators as operators
from tests.conformance import test_kafka_stores as stores
from tests.conformance.test_kafka_operators import OPS, operator_batches
from tests.conformance.test_kafka_stores import store_scenarios
from tests.support.conformance import (
    FIXED_SEED,
    TimeLimit,
    append_report,
    backstop_s,
    conformance_seed,
    repeat_hint,
    time_limit_s,
)


def test_the_seed_comes_from_the_environment_else_the_fixed_one() -> None:
    assert conformance_seed({"VERSIQ_CONFORMANCE_SEED": "1972842867"}) == 1972842867
    assert conformance_seed({}) == conformance_seed({"VERSIQ_CONFORMANCE_SEED": ""}) == FIXED_SEED
    assert repeat_hint(7) == "repeat them with VERSIQ_CONFORMANCE_SEED=7 make conformance"


def test_a_seed_decides_the_store_scenarios() -> None:
    one, two = store_scenarios(1, 30), store_scenarios(2, 30)
    assert one == store_scenarios(1, 30)
    assert one != two and not set(map(repr, one)) & set(map(repr, two))
    assert store_scenarios(1, 10) == one[:10]  # more scenarios extend the same list


def test_a_seed_decides_the_operator_scenarios() -> None:
    one, two = operator_batches(1, 20), operator_batches(2, 20)
    assert one == operator_batches(1, 20)
    assert one != two
    ops = [config.op for batch in one for config, _ in batch]
    assert sorted(set(ops)) == sorted(OPS)


def test_the_differential_tests_run_their_seed_once() -> None:
    """Not Hypothesis tests: Hypothesis would draw its simplest seed (0) whatever the run, and
    replay a failing example, reporting each difference a second time."""
    assert not is_hypothesis_test(stores.test_versioned_stores_agree_with_kafka_streams)
    assert not is_hypothesis_test(operators.test_operators_agree_with_kafka_streams)


def test_the_report_lists_each_difference_once(tmp_path) -> None:
    report = str(tmp_path / "report.txt")
    found = ["Config(op='join') g0s1: emissions: kafka [] versiq [('k1', None, 3)]\n    runs [{0: []}]",
             "Config(op='filter') g1s0: result table, key k2: kafka None versiq ('1', 2)\n    runs [{0: []}]"]
    assert append_report(report, "seed 5 batch 0", found) == [f"seed 5 batch 0: {d}" for d in found]
    assert append_report(report, "seed 5 batch 0", [found[1], found[0], found[1]]) == []  # a rerun
    assert append_report(report, "seed 6 batch 0", found[:1]) == [f"seed 6 batch 0: {found[0]}"]
    text = (tmp_path / "report.txt").read_text()
    assert text.count("emissions: kafka") == 2 and text.count("result table") == 1
    assert text.count("\n    runs") == 3


def test_the_time_limit_scales_with_the_scenarios_and_the_machine() -> None:
    small, large = time_limit_s(200, {}, factor=1.0), time_limit_s(50_000, {}, factor=1.0)
    assert 600 <= small < large
    assert time_limit_s(200, {}, factor=3.0) == 3 * small  # a loaded machine gets longer
    assert time_limit_s(50_000, {"VERSIQ_CONFORMANCE_TIMEOUT": "60"}) == 60
    assert backstop_s(1) > 600  # a short limit still leaves Spark time to start (setup counts)


def test_a_run_over_its_time_limit_says_so_in_one_line() -> None:
    now = [100.0]
    limit = TimeLimit(50, "conformance (operators)", clock=lambda: now[0])
    limit.check(1, 10, 0, 42)  # within the limit
    now[0] = 200.0
    limit.check(10, 10, 0, 42)  # every batch done: a finished run never fails on time
    with pytest.raises(pytest.fail.Exception) as failed:
        limit.check(3, 10, 2, 42)
    message = str(failed.value)
    assert "\n" not in message
    assert message == ("conformance (operators): over its time limit of 50 s (100 s, VERSIQ_CONFORMANCE_TIMEOUT "
                       "sets it) after 3 of 10 batches, 2 difference(s) so far; seed 42")
